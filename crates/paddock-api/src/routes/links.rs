//! The document's OpenAPI links: which later calls an answer's ids feed (a created tenant's id
//! into its view, update and delete; a 202's operation id into the operation's view; ...). A
//! client generator or a stateful fuzzer (scripts/fuzz) follows them. Declared here in one table
//! instead of on each `#[utoipa::path]`, and added once the document is assembled (`add`).

use std::collections::BTreeMap;

use utoipa::openapi::extensions::Extensions;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::{OpenApi, RefOr};

/// The answers of one operation whose ids feed the operations `to`: each link passes the path
/// parameters its target declares, taken from `values` (parameter name, runtime expression).
struct Follow {
    from: &'static str,
    status: &'static str,
    to: &'static [&'static str],
    values: &'static [(&'static str, &'static str)],
}

const TENANT: &[(&str, &str)] = &[("tenant_id", "$response.body#/id")];
/// A `ClusterAccepted`.
const CLUSTER: &[(&str, &str)] = &[
    ("tenant_id", "$response.body#/cluster/tenant_id"),
    ("cluster_id", "$response.body#/cluster/id"),
    ("operation_id", "$response.body#/operation/id"),
];
/// A `NodePoolAccepted` (a node pool names its cluster, not its tenant: that is the request's).
const NODE_POOL: &[(&str, &str)] = &[
    ("tenant_id", "$request.path.tenant_id"),
    ("cluster_id", "$response.body#/node_pool/cluster_id"),
    ("pool_id", "$response.body#/node_pool/id"),
    ("operation_id", "$response.body#/operation/id"),
];
/// A `MachineAccepted` (a machine's operation is the provider's: it has no tenant).
const MACHINE: &[(&str, &str)] =
    &[("machine_id", "$response.body#/machine/id"), ("operation_id", "$response.body#/operation/id")];
const MACHINE_CLASS: &[(&str, &str)] = &[("name", "$response.body#/name")];

const TENANT_NEXT: &[&str] = &[
    "tenant_view",
    "tenant_update",
    "tenant_delete",
    "tenant_suspend",
    "tenant_resume",
    "cluster_create",
    "cluster_list",
    "tenant_operation_list",
];
const CLUSTER_NEXT: &[&str] = &[
    "cluster_view",
    "cluster_update",
    "cluster_delete",
    "cluster_event_list",
    "cluster_kubeconfig",
    "cluster_machine_list",
    "cluster_remediation_list",
    "node_pool_create",
    "node_pool_list",
    "operation_view",
    "tenant_operation_view",
];
const CLUSTER_CHANGED: &[&str] = &["cluster_view", "operation_view", "tenant_operation_view"];
const NODE_POOL_NEXT: &[&str] = &[
    "node_pool_view",
    "node_pool_update",
    "node_pool_delete",
    "node_pool_machine_list",
    "operation_view",
    "tenant_operation_view",
];
const NODE_POOL_CHANGED: &[&str] = &["node_pool_view", "operation_view", "tenant_operation_view"];
const MACHINE_NEXT: &[&str] = &[
    "machine_view",
    "machine_update",
    "machine_retire",
    "machine_custody_view",
    "machine_health_report_list",
    "machine_maintenance_enter",
    "machine_maintenance_leave",
    "machine_force_release",
    "operation_view",
];
const MACHINE_CHANGED: &[&str] = &["machine_view", "operation_view"];
/// A `RemediationAccepted`: the cluster's remediations and the operation to follow.
const REPLACE: &[(&str, &str)] = &[
    ("tenant_id", "$response.body#/remediation/tenant_id"),
    ("cluster_id", "$response.body#/remediation/cluster_id"),
    ("operation_id", "$response.body#/operation/id"),
];
const REPLACE_NEXT: &[&str] = &["cluster_remediation_list", "operation_view", "tenant_operation_view"];

const FOLLOWS: &[Follow] = &[
    Follow { from: "tenant_create", status: "201", to: TENANT_NEXT, values: TENANT },
    Follow { from: "cluster_create", status: "202", to: CLUSTER_NEXT, values: CLUSTER },
    Follow { from: "cluster_update", status: "202", to: CLUSTER_CHANGED, values: CLUSTER },
    Follow { from: "cluster_delete", status: "202", to: CLUSTER_CHANGED, values: CLUSTER },
    Follow { from: "node_pool_create", status: "202", to: NODE_POOL_NEXT, values: NODE_POOL },
    Follow { from: "node_pool_update", status: "202", to: NODE_POOL_CHANGED, values: NODE_POOL },
    Follow { from: "node_pool_delete", status: "202", to: NODE_POOL_CHANGED, values: NODE_POOL },
    Follow { from: "machine_enroll", status: "202", to: MACHINE_NEXT, values: MACHINE },
    Follow { from: "machine_update", status: "202", to: MACHINE_CHANGED, values: MACHINE },
    Follow { from: "machine_retire", status: "202", to: MACHINE_CHANGED, values: MACHINE },
    Follow { from: "machine_maintenance_enter", status: "202", to: MACHINE_CHANGED, values: MACHINE },
    Follow { from: "machine_maintenance_leave", status: "202", to: MACHINE_CHANGED, values: MACHINE },
    Follow { from: "machine_force_release", status: "202", to: MACHINE_CHANGED, values: MACHINE },
    Follow { from: "cluster_machine_replace", status: "202", to: REPLACE_NEXT, values: REPLACE },
    Follow {
        from: "cluster_machine_power_cycle",
        status: "202",
        to: &["operation_view", "tenant_operation_view"],
        values: &[("tenant_id", "$request.path.tenant_id"), ("operation_id", "$response.body#/id")],
    },
    Follow {
        from: "machine_class_create",
        status: "201",
        to: &["machine_class_view", "machine_class_update", "machine_class_delete"],
        values: MACHINE_CLASS,
    },
];

/// Adds the links of `FOLLOWS` to the answers of `openapi`'s operations. A name in the table that
/// the document lacks (an operation, a status, a path parameter with no value) is a programming
/// error: the test below fails on it.
pub fn add(openapi: &mut OpenApi) {
    let path_parameters = path_parameters(openapi);
    for follow in FOLLOWS {
        let Some(RefOr::T(response)) =
            operation(openapi, follow.from).and_then(|op| op.responses.responses.get_mut(follow.status))
        else {
            continue;
        };
        for &to in follow.to {
            let names = path_parameters.get(to).map(Vec::as_slice).unwrap_or_default();
            let link = follow
                .values
                .iter()
                .filter(|(name, _)| names.iter().any(|n| n == name))
                .fold(LinkBuilder::new(), |link, (name, value)| link.parameter(format!("path.{name}"), *value));
            // utoipa 5.5 writes `Link::operation_id` as "operation_id", a key no reader knows; the
            // specification's "operationId" goes through the extensions map, written as given.
            let link = link.extensions(Some(Extensions::from_iter([("operationId", to)])));
            response.links.insert(to.to_owned(), link.build().into());
        }
    }
}

/// Every operation's path parameters, by operation id.
fn path_parameters(openapi: &OpenApi) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for item in openapi.paths.paths.values() {
        for op in [&item.get, &item.put, &item.post, &item.delete, &item.patch].into_iter().flatten() {
            let names = op.parameters.iter().flatten().filter(|p| p.parameter_in == ParameterIn::Path);
            out.insert(op.operation_id.clone().unwrap_or_default(), names.map(|p| p.name.clone()).collect());
        }
    }
    out
}

fn operation<'a>(openapi: &'a mut OpenApi, id: &str) -> Option<&'a mut Operation> {
    openapi.paths.paths.values_mut().find_map(|item| {
        [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch]
            .into_iter()
            .flatten()
            .find(|op| op.operation_id.as_deref() == Some(id))
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    /// Every link of the table lands in the served document as the specification spells it: its
    /// source answer exists, it names an existing target by `operationId`, and each of the
    /// target's path parameters gets a value.
    #[test]
    fn every_link_reaches_an_operation_with_all_its_path_parameters() {
        let path_parameters = path_parameters(&crate::openapi());
        let doc: Value = serde_json::from_str(&crate::openapi_json()).expect("json");
        let operations: BTreeMap<&str, &Value> = doc["paths"]
            .as_object()
            .into_iter()
            .flat_map(|paths| paths.values())
            .flat_map(|item| item.as_object().into_iter().flat_map(|ops| ops.values()))
            .map(|op| (op["operationId"].as_str().unwrap_or_default(), op))
            .collect();
        for follow in FOLLOWS {
            let op = operations.get(follow.from).unwrap_or_else(|| panic!("no operation {}", follow.from));
            let links = &op["responses"][follow.status]["links"];
            for &to in follow.to {
                let names =
                    path_parameters.get(to).unwrap_or_else(|| panic!("{} links to a missing {to}", follow.from));
                let link = &links[to];
                assert_eq!(link["operationId"], to, "{} -> {to}: {link}", follow.from);
                let given: Vec<&str> = link["parameters"]
                    .as_object()
                    .into_iter()
                    .flat_map(|p| p.keys())
                    .filter_map(|k| k.strip_prefix("path."))
                    .collect();
                let mut wanted: Vec<&str> = names.iter().map(String::as_str).collect();
                wanted.sort_unstable();
                assert_eq!(given, wanted, "{} -> {to}: the link's path parameters", follow.from);
            }
        }
    }
}
