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

mod config;
mod helpers;
mod ingest;
mod operators;
mod queue;
mod resilience;
mod routes;
mod store;
