//! Cursor pagination: `?limit=&cursor=` in, `{items, next_cursor}` out.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Default page size.
pub const DEFAULT_LIMIT: u32 = 100;
/// Largest accepted page size; a larger `limit` is 422, not clamped.
pub const MAX_LIMIT: u32 = 1000;

/// One page of a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    /// The items of this page, in a stable order.
    pub items: Vec<T>,
    /// Opaque cursor of the next page, null at the end.
    pub next_cursor: Option<String>,
}

/// Paging parameters shared by every list.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Page size. Kept as text until validated, so that any integer out of range is a 422.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 1000, default = 100)]
    pub limit: Option<String>,
    /// Opaque cursor from a previous page's `next_cursor`.
    #[param(max_length = 512)]
    pub cursor: Option<String>,
}
