//! Store errors, and their one mapping to the domain error.

use paddock_domain::Error;

/// What went wrong talking to PostgreSQL.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached (pool timeout, connection refused, server shutting down).
    #[error("database unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// A unique constraint refused the write.
    #[error("unique constraint {constraint} violated")]
    Unique {
        /// The constraint (index) name.
        constraint: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// A foreign key refused the write: what it refers to was deleted meanwhile (a race with a
    /// concurrent delete; the services check references before they write).
    #[error("foreign key {constraint} violated")]
    ForeignKey {
        /// The constraint name.
        constraint: String,
        /// The database error.
        #[source]
        source: sqlx::Error,
    },
    /// Any other failing query.
    #[error("database query failed")]
    Query(#[source] sqlx::Error),
    /// The database URL is malformed.
    #[error("invalid database URL")]
    Config(#[source] sqlx::Error),
    /// Migrations failed.
    #[error("migrating the database failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    /// A stored value the code cannot read.
    #[error("stored data is invalid: {0}")]
    Corrupt(String),
    /// A sum of usage seconds left the range of a 64-bit integer.
    #[error("the sum of {what} exceeds 64 bits")]
    Overflow {
        /// What was summed.
        what: &'static str,
    },
    /// A value could not be sealed or opened.
    #[error("encrypting or decrypting a stored secret failed")]
    Cipher(#[from] paddock_domain::secret::CipherError),
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e),
            sqlx::Error::Database(db) => {
                let code = db.code().unwrap_or_default().to_string();
                if code == "23505" {
                    let constraint = db.constraint().unwrap_or_default().to_owned();
                    StoreError::Unique { constraint, source: e }
                } else if code == "23503" {
                    let constraint = db.constraint().unwrap_or_default().to_owned();
                    StoreError::ForeignKey { constraint, source: e }
                } else if code.starts_with("08")
                    || code == "57P01"
                    || code == "57P03"
                    || code == "40P01"
                    || code == "40001"
                    || code == "57014"
                {
                    // Connection exceptions, admin shutdown, cannot connect now; and a deadlock
                    // or serialization failure that PostgreSQL resolved by aborting this
                    // transaction: nothing was written, and the same request may succeed at
                    // once, so the caller gets a retryable answer (503 with Retry-After), never
                    // a 500. Likewise a statement cancelled by the statement timeout (57014):
                    // the database is too slow now, and the transaction was rolled back.
                    StoreError::Unavailable(e)
                } else {
                    StoreError::Query(e)
                }
            }
            _ => StoreError::Query(e),
        }
    }
}

/// Conflicts by constraint name: the one table of what a taken name means.
fn conflict_for(constraint: &str) -> Option<(&'static str, &'static str)> {
    Some(match constraint {
        "tenants_name_key" => ("tenant_name_taken", "a tenant with this name already exists"),
        "machine_classes_name_key" => ("machine_class_name_taken", "a machine class with this name already exists"),
        "machines_name_key" => ("machine_name_taken", "a machine with this name is already enrolled"),
        "machines_bmc_system_key" => (
            "machine_already_enrolled",
            "a machine that is not retired is already enrolled with this BMC system (same BMC address and system id)",
        ),
        "machines_system_uuid_key" => {
            ("duplicate_system", "a machine that is not retired already holds this system UUID")
        }
        "clusters_tenant_name_key" => ("cluster_name_taken", "the tenant already has a cluster with this name"),
        "node_pools_cluster_name_key" => ("node_pool_name_taken", "the cluster already has a node pool with this name"),
        "identity_users_tenant_user_name_key" => ("uniqueness", "the tenant already has a user with this userName"),
        "identity_numbers_pkey" => {
            ("uniqueness", "this uidNumber or gidNumber is held by another user or group of the tenant")
        }
        "identity_groups_tenant_display_name_key" => {
            ("uniqueness", "the tenant already has a group with this displayName")
        }
        _ => return None,
    })
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(source) => Error::Unavailable(Some(Box::new(source))),
            StoreError::Unique { constraint, source } => match conflict_for(&constraint) {
                Some((code, message)) => Error::conflict(code, message),
                None => Error::internal(source),
            },
            StoreError::ForeignKey { .. } => Error::conflict(
                "reference_changed",
                "an object this request refers to was changed or deleted at the same time; retry",
            ),
            StoreError::Overflow { .. } => Error::conflict(
                "usage_overflow",
                "the usage sums exceed the range of a 64-bit integer (9223372036854775807 seconds): narrow the query",
            ),
            other => Error::internal(other),
        }
    }
}
