// A resource's verifier as a JSON-lines process: one request per line on stdin, one
// answer per line on stdout, in order. tests/integration/test_verify_ts.py drives it
// against certificates from a real cluster; it is also a way to put the TypeScript
// verifier behind any resource that can talk to a child process.
//
//   {"op": "keys", "keys": "<raftlease cert-keys output>", "drift_allowance": 0.5}
//   {"op": "challenge"}                        -> {"ok": true, "challenge": "<hex>"}
//   {"op": "check", "certificate": "...", "proof": "...", "challenge": "<hex>",
//    "message": "<hex>", "key": "gpu-0"}      -> {"ok": true, "key": ..., "token": "7"}
//                                              or {"ok": false, "code": "BAD_PROOF", ...}
//   {"op": "parse", "certificate": "..."}      -> the fields, or the refusal code
//   {"op": "advance", "seconds": 30}           -> moves this resource's clock ahead
//
// A request this driver cannot read gets {"ok": false, "code": "BAD_REQUEST"}; it never
// exits on bad input (stdin closed ends it).

import { createInterface } from "readline";
import { CertificateError, Certificate, Verifier, loadKeys, parse } from "./verify";

let offset = 0; // seconds added to this process's clock ("advance")
let verifier: Verifier | null = null;

type Answer = Record<string, unknown>;

function fields(cert: Certificate): Answer {
  return {
    ok: true,
    kid: cert.kid,
    key: cert.key,
    token: cert.token.toString(),
    principal: cert.principal,
    units: cert.units,
    slots: cert.unitIndices,
    holder: Buffer.from(cert.holder).toString("hex"),
    not_after: cert.notAfterMs.toString(),
    issued_at: cert.issuedAtMs.toString(),
    op: cert.op,
  };
}

function handle(request: Record<string, unknown>): Answer {
  switch (request.op) {
    case "keys":
      verifier = new Verifier(loadKeys(String(request.keys)), {
        driftAllowance: Number(request.drift_allowance ?? 0.5),
        clock: () => Date.now() / 1000 + offset,
      });
      return { ok: true };
    case "advance":
      offset += Number(request.seconds);
      return { ok: true };
    case "parse":
      return fields(parse(request.certificate));
    case "challenge":
      if (verifier === null) return { ok: false, code: "BAD_REQUEST", message: "no keys yet" };
      return { ok: true, challenge: verifier.challenge().toString("hex") };
    case "check": {
      if (verifier === null) return { ok: false, code: "BAD_REQUEST", message: "no keys yet" };
      const key = typeof request.key === "string" ? request.key : undefined;
      const cert = verifier.check(
        String(request.certificate),
        String(request.proof),
        Buffer.from(String(request.challenge ?? ""), "hex"),
        Buffer.from(String(request.message ?? ""), "hex"),
        key,
      );
      return fields(cert);
    }
    default:
      return { ok: false, code: "BAD_REQUEST", message: `unknown op ${String(request.op)}` };
  }
}

const lines = createInterface({ input: process.stdin, terminal: false });
lines.on("line", (line: string) => {
  let answer: Answer;
  try {
    answer = handle(JSON.parse(line) as Record<string, unknown>);
  } catch (exc) {
    answer =
      exc instanceof CertificateError
        ? { ok: false, code: exc.code, message: exc.message }
        : { ok: false, code: "BAD_REQUEST", message: String(exc) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
});
