//! Handlers: extract, call one service function, map the result to a view. Nothing else.

pub mod agent;
pub mod audit;
pub mod cluster;
pub mod custody;
pub mod doc;
pub mod health;
pub mod isolation;
pub mod links;
pub mod machine;
pub mod machine_class;
pub mod operation;
pub mod remediation;
pub mod scim_token;
pub mod tenant;
pub mod usage;
pub mod webhook;
