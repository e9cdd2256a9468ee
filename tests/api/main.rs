//! hookgate's integration suite: one binary, real PostgreSQL (a schema per test), a real
//! HTTP target that counts deliveries. Run it with `scripts/test.sh`.

/// Runs each named test against each store.
macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod postgres {
            $(
                #[actix_web::test]
                async fn $name() {
                    super::$name(crate::helpers::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[actix_web::test]
                async fn $name() {
                    super::$name(crate::helpers::Backend::Sqlite).await;
                }
            )*
        }
    };
}

mod bad_input;
mod concurrency;
mod console;
mod duplicates;
mod edges;
mod failover;
mod failures;
mod helpers;
mod history;
mod model;
mod operators;
mod paths;
mod pauses;
mod plans;
mod pressure;
mod providers;
mod queue;
mod queue_promise;
mod ring;
mod runner_faults;
mod safe_defaults;
mod store_conformance;
mod tls;
