//! The edges an operator deploys with: the shipped config safe by default, the files in
//! `deploy/`, commands that explain themselves.

mod edges;
mod safe_defaults;
