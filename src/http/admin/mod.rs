//! Operators' HTTP surface under `/admin/`, behind one bearer token: the console's files,
//! the older event and dead-letter routes, and the JSON API the console calls. This file
//! only re-exports; `routes.rs` mounts each file's routes in the one `/admin/` scope.

pub(super) mod api;
pub(super) mod console;
pub(super) mod dead;
pub(super) mod events;
pub(super) mod rekey;
mod shared;

pub(super) use shared::enabled;
