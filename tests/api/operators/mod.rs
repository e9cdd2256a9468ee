//! What operators do: the admin API and the console, dead letters and their replay,
//! history, searches, pauses and bulk replays.

mod admin;
mod common;
mod console;
mod history;
mod pauses;
