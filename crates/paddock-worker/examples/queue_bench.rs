//! The worker side of `bench/queue/run`: how many no-op jobs per second a few workers drain.
//!
//! ```text
//! queue_bench <database-url> migrate
//! queue_bench <database-url> run <jobs> <workers> <concurrency>
//! ```
//!
//! `run` starts `workers` workers in this process, each with its own connection pool (as separate
//! processes would have, configured by `Store::connect_lazy` as in production), all running a handler that does nothing, and measures the time from
//! their start until `jobs` jobs have succeeded (counted by the workers' own metrics, so the
//! measurement adds no queries). The jobs are enqueued beforehand by the script. It prints one
//! line: `jobs=<n> seconds=<s> jobs_per_second=<r> per_worker=<a,b,...>`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use paddock_store::Store;
use paddock_worker::{Job, JobHandler, Outcome, Worker, WorkerConfig};
use sqlx::postgres::PgPoolOptions;

/// The bench's job kind (the script enqueues this kind).
const KIND: &str = "bench_noop";

struct Noop;

impl JobHandler for Noop {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn run<'a>(&'a self, _job: &'a Job) -> BoxFuture<'a, Outcome> {
        Box::pin(async { Outcome::Done })
    }
}

fn usage() -> ! {
    eprintln!("usage: queue_bench <database-url> migrate | run <jobs> <workers> <concurrency>");
    std::process::exit(2)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize) -> T {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or_else(|| usage())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url = args.get(1).unwrap_or_else(|| usage());
    match args.get(2).map(String::as_str) {
        Some("migrate") => {
            let pool = PgPoolOptions::new().max_connections(1).connect(url).await?;
            paddock_store::MIGRATOR.run(&pool).await?;
        }
        Some("run") => {
            let (jobs, workers, concurrency): (u64, usize, usize) = (arg(&args, 3), arg(&args, 4), arg(&args, 5));
            run(url, jobs, workers, concurrency).await?;
        }
        _ => usage(),
    }
    Ok(())
}

async fn run(url: &str, jobs: u64, workers: usize, concurrency: usize) -> Result<(), Box<dyn std::error::Error>> {
    let config = WorkerConfig {
        concurrency,
        lease: Duration::from_secs(30),
        poll_interval: Duration::from_millis(200),
        ..WorkerConfig::default()
    };
    // Each worker gets a pool configured as in production (`Store::connect_lazy`), filled before
    // the clock starts so connection set-up is not measured.
    let mut all = Vec::new();
    for i in 0..workers {
        let store = Store::connect_lazy(url, u32::try_from(concurrency + 3)?)?;
        let mut warm = Vec::new();
        for _ in 0..concurrency + 3 {
            warm.push(store.conn().await?);
        }
        drop(warm);
        let handlers: Vec<Arc<dyn JobHandler>> = vec![Arc::new(Noop)];
        all.push(Worker::new(store, format!("bench-{i}"), handlers, config.clone())?);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let tasks: Vec<_> = all
        .iter()
        .map(|w| {
            let (w, mut stop) = (w.clone(), stop_rx.clone());
            tokio::spawn(async move {
                w.run(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            })
        })
        .collect();
    let metrics: Vec<_> = all.iter().map(Worker::metrics).collect();
    let done = || metrics.iter().map(|m| m.get(KIND, "succeeded")).sum::<u64>();
    while done() < jobs {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {} of {jobs} jobs done after 600 s", done()).into());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    for t in tasks {
        t.await?;
    }
    let per_worker: Vec<String> = metrics.iter().map(|m| m.get(KIND, "succeeded").to_string()).collect();
    let failed: u64 = metrics.iter().map(|m| m.total("lease_lost") + m.total("failed")).sum();
    println!(
        "jobs={} seconds={seconds:.3} jobs_per_second={:.0} per_worker={} anomalies={failed}",
        done(),
        done() as f64 / seconds,
        per_worker.join(",")
    );
    Ok(())
}
