//! Signature verification: proves a delivery came from the sender holding the shared
//! secret, over the raw body bytes, before anything is claimed.
//!
//! Schemes: [`hmac`] (a header carrying an HMAC of a template over the body, optionally with
//! a timestamp — GitHub, Shopify, Slack and hand-configured senders are specs of it),
//! [`stripe`] and [`standard`] (Standard Webhooks / Svix) with their own header formats.
//! Every comparison is constant-time (`subtle`). Errors name the reason, never the expected
//! signature. Time is a parameter, so every window is testable.
//!
//! Cost is bounded before any hashing: a header lists at most [`MAX_CANDIDATES`]
//! signatures, candidates of the wrong length or encoding are dropped unread, and the MAC
//! is computed once per secret and then compared with each candidate — so the worst
//! rejected request costs what a valid one costs (one HMAC of the body per secret).
//!
//! The files import one another one way (this one only re-exports): `verifier` → the
//! schemes (`hmac`, `stripe`, `standard`) → `header`, `window`, `error`.

mod error;
mod header;
pub mod hmac;
pub mod standard;
pub mod stripe;
mod verifier;
mod window;

pub use error::SignatureError;
pub use header::{candidates, header, MAX_CANDIDATES};
pub use verifier::{Scheme, SigningKey, Verifier};
pub use window::Window;
