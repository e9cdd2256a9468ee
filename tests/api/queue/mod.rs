//! Queue mode: 202 once durable, hookgate as the redeliverer, and its promise through
//! replays, lost renewals and slow outcome writes.

mod mode;
mod queue_promise;
