// Take a lease from raftlease over its HTTP/JSON API with plain fetch (no SDK):
// acquire (waiting in the key's queue), hand the fencing token to what the lease
// protects, renew, release. Any node's HTTP address will do: a follower forwards.
//
//   RAFTLEASE_URL=http://127.0.0.1:7201 RAFTLEASE_KEY=gpu/0 npx tsx lease.ts
//   (RAFTLEASE_TOKEN=<bearer token> on a secured cluster; https:// with TLS)
//
// See docs/http-api.md for every resource, the error format and the status table.

interface Grant {
  key: string;
  owner: string;
  token: number;
  lease_id: string;
  ttl: number;
}

interface ErrorBody {
  code: string;
  message: string;
  definite: boolean;
}

const BASE: string = process.env.RAFTLEASE_URL ?? "http://127.0.0.1:7201";
const KEY: string = process.env.RAFTLEASE_KEY ?? "gpu/0";
const AUTH: string = process.env.RAFTLEASE_TOKEN ?? "";

// An error answer: the wire code, and whether the request certainly did not apply.
class RaftLeaseError extends Error {
  code: string;
  definite: boolean;
  constructor(body: ErrorBody) {
    super(`${body.code}: ${body.message}`);
    this.code = body.code;
    this.definite = body.definite;
  }
}

// One request. A mutating request carries an Idempotency-Key: retried with the same
// key (after a timeout, a dropped connection) it gets the first answer, never a
// second grant.
async function call(path: string, body: object, idempotencyKey: string): Promise<any> {
  const headers: Record<string, string> = { "Content-Type": "application/json" };
  if (AUTH) {
    headers["Authorization"] = `Bearer ${AUTH}`;
  }
  if (idempotencyKey) {
    headers["Idempotency-Key"] = idempotencyKey;
  }
  for (let attempt = 1; ; attempt++) {
    let response: Response;
    try {
      response = await fetch(`${BASE}${path}`, {
        method: "POST",
        headers: headers,
        body: JSON.stringify(body),
      });
    } catch (err) {
      if (attempt >= 3) {
        throw err;
      }
      continue; // the same key: safe to send again
    }
    const answer: any = await response.json();
    if (response.ok) {
      return answer;
    }
    const error = new RaftLeaseError(answer.error);
    // Not definite (a timeout, a leader change): it may have applied; retry it.
    if (error.definite || attempt >= 3) {
      throw error;
    }
  }
}

async function main(): Promise<void> {
  const owner: string = `ts-example-${process.pid}`;
  // Wait up to 10 s in the key's queue (a long-poll), for a 15 s lease.
  const grant: Grant = await call(
    "/v1/leases/acquire",
    { key: KEY, owner: owner, ttl: 15, wait: 10 },
    crypto.randomUUID(),
  );
  console.log(`acquired ${grant.key} token=${grant.token}`);

  // Give the token to whatever the lease protects; it refuses lower tokens.
  console.log(`writing to the protected resource with fencing token ${grant.token}`);

  const lease = { key: grant.key, lease_id: grant.lease_id };
  const renewed: Grant = await call("/v1/leases/renew", lease, crypto.randomUUID());
  console.log(`renewed ${renewed.key} token=${renewed.token}`);

  await call("/v1/leases/release", lease, crypto.randomUUID());
  console.log(`released ${grant.key}`);
}

main().catch((err) => {
  console.error(`failed: ${err.message}`);
  process.exit(1);
});
