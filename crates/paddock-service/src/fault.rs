//! Fault points for tests. Only a build with the `fault-injection` feature (which test packages
//! enable, never the binary) has them; elsewhere every point is an empty function. A test arms a
//! point for one request, named by its request id; the request then stops at that point for good,
//! as if its process had been killed there: nothing after the point runs, no answer is sent.

/// Right after the transaction that carries a request's effect committed.
pub const AFTER_COMMIT: &str = "after_commit";

#[cfg(feature = "fault-injection")]
static ARMED: std::sync::Mutex<std::collections::BTreeSet<(&'static str, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Arms `point` for the request whose request id is `request_id`.
#[cfg(feature = "fault-injection")]
pub fn arm(point: &'static str, request_id: &str) {
    ARMED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert((point, request_id.to_owned()));
}

/// Where the request `request_id` passes `point`: never returns when the point is armed for it.
pub(crate) async fn reached(point: &'static str, request_id: &str) {
    #[cfg(feature = "fault-injection")]
    {
        let armed =
            ARMED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).contains(&(point, request_id.to_owned()));
        if armed {
            tracing::warn!(
                fault.point = point,
                request.id = request_id,
                "fault point {point} reached: the request stops"
            );
            std::future::pending::<()>().await;
        }
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = (point, request_id);
}
