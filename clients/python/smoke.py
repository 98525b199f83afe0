"""The generated Python client (openapi-python-client, from openapi/openapi.json) against a
running paddock on the simulated drivers: what a portal does first. Run by scripts/clients
--smoke with B, TOKEN, TENANT_TOKEN and TID in the environment (what `paddock dev` prints)."""

import datetime
import os
import sys
import time
import uuid

from paddock_client import AuthenticatedClient
from paddock_client.api.clusters import cluster_create, cluster_view
from paddock_client.api.operations import tenant_operation_view
from paddock_client.api.tenants import tenant_create, tenant_list
from paddock_client.api.usage import tenant_usage_record_list
from paddock_client.models import ClusterCreate, Problem, TenantCreate


def check(response, status):
    """The parsed body of a response that has the expected status, else exit naming both."""
    if response.status_code != status:
        sys.exit(f"expected {status}, got {response.status_code}: {response.content!r}")
    return response.parsed


def main():
    base, tid = os.environ["B"], uuid.UUID(os.environ["TID"])
    provider = AuthenticatedClient(base_url=base, token=os.environ["TOKEN"], raise_on_unexpected_status=True)
    tenant = AuthenticatedClient(base_url=base, token=os.environ["TENANT_TOKEN"], raise_on_unexpected_status=True)
    suffix = uuid.uuid4().hex[:8]

    # A tenant, then every tenant page by page (limit 1: the cursor is followed to its end).
    created = check(tenant_create.sync_detailed(client=provider, body=TenantCreate(name=f"py-{suffix}", display_name="Python")), 201)
    names, cursor = [], None
    while True:
        page = check(tenant_list.sync_detailed(client=provider, limit=1, **({"cursor": cursor} if cursor else {})), 200)
        names += [t.name for t in page.items]
        cursor = page.next_cursor if isinstance(page.next_cursor, str) else None
        if not cursor:
            break
    assert created.name in names and "acme" in names, names
    print(f"tenants, one per page: {len(names)}")

    # A cluster as the tenant, its operation followed to the end.
    body = ClusterCreate.from_dict({
        "name": f"py-{suffix}", "kind": "slurm", "isolation": "private-nodes",
        "node_pools": [{"name": "gpu", "machine_class": "gpu-h100x8", "count": 1, "role": "system"}],
    })
    accepted = check(cluster_create.sync_detailed(tid, client=tenant, body=body), 202)
    deadline = time.monotonic() + 120
    while True:
        op = check(tenant_operation_view.sync_detailed(tid, accepted.operation.id, client=tenant), 200)
        if op.state.value in ("succeeded", "failed", "superseded"):
            break
        assert time.monotonic() < deadline, f"operation still {op.state.value}"
        time.sleep(0.5)
    assert op.state.value == "succeeded", op
    cluster = check(cluster_view.sync_detailed(tid, accepted.cluster.id, client=tenant), 200)
    print(f"cluster {cluster.name}: {cluster.status.phase.value}, operation {op.state.value}")

    # The tenant's usage of the last hour (its cluster's control plane is metered from ready).
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    usage = check(tenant_usage_record_list.sync_detailed(
        tid, client=tenant, from_=now - datetime.timedelta(hours=1), to=now + datetime.timedelta(hours=1)), 200)
    print(f"usage records: {len(usage.items)} as of {usage.as_of.isoformat()}")

    # A problem: a foreign or missing cluster is a 404 with a stable code.
    missing = cluster_view.sync_detailed(tid, uuid.UUID(int=0), client=tenant)
    problem = check(missing, 404)
    assert isinstance(problem, Problem), problem
    print(f"problem: {problem.code}")
    assert problem.code == "not_found", problem


if __name__ == "__main__":
    main()
