//! `BmcLimiter`: the concurrency bounds of docs/security.md, shared by every client of a process.
//!
//! - At most one operation in flight per machine (key: the machine id or system UUID the caller
//!   chooses). A [`RedfishClient`](crate::RedfishClient) holds this permit for a whole operation,
//!   so e.g. a power convergence and a media insert on one machine never interleave.
//! - At most `per_host` HTTP requests in flight per BMC host (`host:port`). Held per request, not
//!   per operation, so a machine that is waiting for its power state does not hold a host slot.
//!
//! A call waits for its permits (FIFO, tokio semaphores). Permits are always taken machine first,
//! then host, and a host permit is never held while waiting for a machine permit, so the two
//! bounds cannot deadlock. Idle keys are dropped, so the maps do not grow with machine churn.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Shared per-machine and per-host bounds. Cheap to clone; clones share the same bounds.
#[derive(Clone, Debug)]
pub struct BmcLimiter {
    machines: Arc<Keyed>,
    hosts: Arc<Keyed>,
}

impl BmcLimiter {
    /// One call per machine, `per_host` requests per BMC host (at least 1).
    pub fn new(per_host: usize) -> Self {
        Self { machines: Arc::new(Keyed::new(1)), hosts: Arc::new(Keyed::new(per_host.max(1))) }
    }

    /// The per-host bound.
    pub fn per_host(&self) -> usize {
        self.hosts.limit
    }

    /// Waits for the machine's single slot.
    pub async fn acquire_machine(&self, machine: &str) -> BmcPermit {
        Keyed::acquire(&self.machines, machine).await
    }

    /// Waits for one of the host's slots.
    pub async fn acquire_host(&self, host: &str) -> BmcPermit {
        Keyed::acquire(&self.hosts, host).await
    }

    /// Machine first, then host, for a caller that makes its own single request.
    pub async fn acquire(&self, machine: &str, host: &str) -> (BmcPermit, BmcPermit) {
        let machine = self.acquire_machine(machine).await;
        let host = self.acquire_host(host).await;
        (machine, host)
    }
}

/// Semaphores by key, created on first use and dropped when idle.
#[derive(Debug)]
struct Keyed {
    limit: usize,
    map: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Keyed {
    fn new(limit: usize) -> Self {
        Self { limit, map: Mutex::new(HashMap::new()) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Semaphore>>> {
        // The map holds no invariant a panicking holder could break half-way.
        self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    async fn acquire(this: &Arc<Self>, key: &str) -> BmcPermit {
        let semaphore =
            this.lock().entry(key.to_owned()).or_insert_with(|| Arc::new(Semaphore::new(this.limit))).clone();
        let permit = match semaphore.clone().acquire_owned().await {
            Ok(permit) => permit,
            // Our semaphores are never closed, so acquiring cannot fail.
            Err(_closed) => unreachable!("BmcLimiter semaphores are never closed"),
        };
        BmcPermit { permit: Some(permit), semaphore, key: key.to_owned(), owner: this.clone() }
    }
}

/// A held slot; dropping it frees the slot.
#[derive(Debug)]
pub struct BmcPermit {
    permit: Option<OwnedSemaphorePermit>,
    semaphore: Arc<Semaphore>,
    key: String,
    owner: Arc<Keyed>,
}

impl Drop for BmcPermit {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut map = self.owner.lock();
        // Under the lock, references are: the map's, ours, and one per holder or waiter (each
        // cloned the Arc under this same lock). Two means nobody else uses the key.
        if Arc::strong_count(&self.semaphore) == 2
            && map.get(&self.key).is_some_and(|s| Arc::ptr_eq(s, &self.semaphore))
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_second_call_for_one_machine_waits_for_the_first() {
        let limiter = BmcLimiter::new(4);
        let first = limiter.acquire_machine("m1").await;
        let waiting = tokio::time::timeout(Duration::from_millis(50), limiter.acquire_machine("m1")).await;
        assert!(waiting.is_err(), "second permit for m1 granted while the first is held");
        // Another machine is not held up.
        let _other = limiter.acquire_machine("m2").await;
        drop(first);
        let _again = limiter.acquire_machine("m1").await;
    }

    #[tokio::test]
    async fn a_host_admits_per_host_calls() {
        let limiter = BmcLimiter::new(2);
        let a = limiter.acquire_host("bmc:443").await;
        let _b = limiter.acquire_host("bmc:443").await;
        assert!(tokio::time::timeout(Duration::from_millis(50), limiter.acquire_host("bmc:443")).await.is_err());
        let _elsewhere = limiter.acquire_host("other:443").await;
        drop(a);
        let _c = limiter.acquire_host("bmc:443").await;
    }

    #[tokio::test]
    async fn idle_keys_are_forgotten() {
        let limiter = BmcLimiter::new(1);
        drop(limiter.acquire("m1", "h1").await);
        assert!(limiter.machines.lock().is_empty());
        assert!(limiter.hosts.lock().is_empty());
        let held = limiter.acquire_machine("m1").await;
        let waiter = {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire_machine("m1").await })
        };
        tokio::task::yield_now().await;
        drop(held);
        // The waiter still gets the same semaphore, and the key stays while it holds it.
        let second = waiter.await.expect("waiter");
        assert_eq!(limiter.machines.lock().len(), 1);
        drop(second);
        assert!(limiter.machines.lock().is_empty());
    }
}
