//! What a sender meets: every path answered and labelled, bad input refused with nothing
//! claimed, each provider's signatures, duplicates answered from their rows, one key
//! delivered once under parallel deliveries.

mod bad_input;
mod concurrency;
mod duplicates;
mod paths;
mod providers;
