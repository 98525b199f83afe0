// The generated TypeScript client (openapi-typescript types from openapi/openapi.json, calls
// through openapi-fetch) against a running paddock on the simulated drivers: what a portal does
// first. Type-checked with tsc (strict), then run by scripts/clients --smoke with B, TOKEN,
// TENANT_TOKEN and TID in the environment (what `paddock dev` prints).
import createClient from "openapi-fetch";
import type { components, paths } from "./schema.js";

type Problem = components["schemas"]["Problem"];

function env(name: string): string {
  const value = process.env[name];
  if (!value) throw new Error(`${name} is not set`);
  return value;
}

function client(token: string) {
  return createClient<paths>({ baseUrl: env("B"), headers: { Authorization: `Bearer ${token}` } });
}

/** The data of a successful call, else an error naming the problem. */
function ok<T>(result: { data?: T; error?: unknown; response: Response }): T {
  if (result.data === undefined) {
    throw new Error(`${result.response.status}: ${JSON.stringify(result.error)}`);
  }
  return result.data;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function main(): Promise<void> {
  const provider = client(env("TOKEN"));
  const tenant = client(env("TENANT_TOKEN"));
  const tid = env("TID");
  const suffix = Math.random().toString(16).slice(2, 10);

  // A tenant, then every tenant page by page (limit 1: the cursor is followed to its end).
  const created = ok(await provider.POST("/v1/tenants", { body: { name: `ts-${suffix}`, display_name: "TypeScript" } }));
  const names: string[] = [];
  let cursor: string | undefined;
  do {
    const page = ok(await provider.GET("/v1/tenants", { params: { query: { limit: 1, cursor } } }));
    names.push(...page.items.map((t) => t.name));
    cursor = page.next_cursor ?? undefined;
  } while (cursor);
  if (!names.includes(created.name) || !names.includes("acme")) throw new Error(`tenants: ${names}`);
  console.log(`tenants, one per page: ${names.length}`);

  // A cluster as the tenant, its operation followed to the end.
  const accepted = ok(
    await tenant.POST("/v1/tenants/{tenant_id}/clusters", {
      params: { path: { tenant_id: tid } },
      body: {
        name: `ts-${suffix}`,
        kind: "slurm",
        isolation: "private-nodes",
        node_pools: [{ name: "gpu", machine_class: "gpu-h100x8", count: 1, role: "system" }],
      },
    }),
  );
  const path = { tenant_id: tid, operation_id: accepted.operation.id };
  const deadline = Date.now() + 120_000;
  let op = accepted.operation;
  while (op.state === "pending" || op.state === "running") {
    if (Date.now() > deadline) throw new Error(`operation still ${op.state}`);
    await sleep(500);
    op = ok(await tenant.GET("/v1/tenants/{tenant_id}/operations/{operation_id}", { params: { path } }));
  }
  if (op.state !== "succeeded") throw new Error(`operation ${op.state}: ${JSON.stringify(op.error)}`);
  const cluster = ok(
    await tenant.GET("/v1/tenants/{tenant_id}/clusters/{cluster_id}", {
      params: { path: { tenant_id: tid, cluster_id: accepted.cluster.id } },
    }),
  );
  console.log(`cluster ${cluster.name}: ${cluster.status.phase}, operation ${op.state}`);

  // The tenant's usage of the last hour (its cluster's control plane is metered from ready).
  const now = Math.floor(Date.now() / 1000) * 1000;
  const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d{3}Z$/, "Z");
  const usage = ok(
    await tenant.GET("/v1/tenants/{tenant_id}/usage/records", {
      params: { path: { tenant_id: tid }, query: { from: iso(now - 3_600_000), to: iso(now + 3_600_000) } },
    }),
  );
  console.log(`usage records: ${usage.items.length} as of ${usage.as_of}`);

  // A problem: a foreign or missing cluster is a 404 with a stable code.
  const missing = await tenant.GET("/v1/tenants/{tenant_id}/clusters/{cluster_id}", {
    params: { path: { tenant_id: tid, cluster_id: "00000000-0000-0000-0000-000000000000" } },
  });
  const problem = missing.error as Problem | undefined;
  if (missing.response.status !== 404 || problem?.code !== "not_found") {
    throw new Error(`expected a 404 not_found: ${missing.response.status} ${JSON.stringify(problem)}`);
  }
  console.log(`problem: ${problem.code}`);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
