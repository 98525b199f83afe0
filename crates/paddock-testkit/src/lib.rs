//! paddock-testkit
