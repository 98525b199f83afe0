//! Gauges for `/metrics`, read from the database at scrape time.

use std::fmt::Write;

use paddock_store::{job, metrics};
use paddock_types::machine::MachineState;

use crate::Services;

impl Services {
    /// Appends the database gauges in the Prometheus text format; a database that does not
    /// answer is reported as `paddock_database_up 0` rather than failing the scrape.
    pub async fn render_gauges(&self, out: &mut String) {
        let read = async {
            let mut conn = self.store.conn().await?;
            let machines = metrics::machines_by_state(&mut conn).await?;
            let jobs = job::depth(&mut conn).await?;
            Ok::<_, paddock_store::StoreError>((machines, jobs))
        };
        out.push_str("# HELP paddock_database_up Whether the database answered the scrape.\n");
        out.push_str("# TYPE paddock_database_up gauge\n");
        let Ok((machines, jobs)) = read.await else {
            out.push_str("paddock_database_up 0\n");
            return;
        };
        out.push_str("paddock_database_up 1\n");
        out.push_str("# HELP paddock_machines Machines by lifecycle state.\n# TYPE paddock_machines gauge\n");
        for state in MachineState::ALL {
            let n = machines.iter().find(|(s, _)| s == state.as_str()).map_or(0, |(_, n)| *n);
            let _ = writeln!(out, "paddock_machines{{state=\"{}\"}} {n}", state.as_str());
        }
        out.push_str("# HELP paddock_queue_depth Jobs of the durable queue not yet finished, by kind and state.\n");
        out.push_str("# TYPE paddock_queue_depth gauge\n");
        for depth in &jobs {
            let _ = writeln!(
                out,
                "paddock_queue_depth{{kind=\"{}\",state=\"{}\"}} {}",
                depth.kind, depth.state, depth.count
            );
        }
    }
}
