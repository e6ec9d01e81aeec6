// Lease certificates checked in TypeScript, offline: the same checks, in the same
// order and with the same refusal codes, as raftlease/verify.py (the reference;
// docs/certificates.md gives the design and the wire format byte by byte).
//
//   const verifier = new Verifier(loadKeys(keysText), { driftAllowance: 0.5 });
//   const challenge = verifier.challenge();     // send it to the holder
//   verifier.check(certificate, proof, challenge, requestBytes, "gpu-0"); // or throws
//
// Node's built-in crypto does Ed25519 and SHA-256; ./msgpack.ts decodes the body. No
// runtime dependency. Everything here is synchronous and nothing blocks; JavaScript
// runs one check at a time, so a check and the fence it raises are one step.
//
// base64url is decoded strictly (RFC 4648 §5, the documented format), as the Python
// verifier does: a certificate or proof with a character outside A-Z a-z 0-9 - _ is
// refused.

import { createPublicKey, createHash, randomBytes, verify as edVerify, KeyObject } from "crypto";
import { decode, Value } from "./msgpack";

/** A certificate's text starts with this (its format version). */
export const PREFIX = "rlc1";
/** Signed before the body bytes. */
export const CERT_DOMAIN = Buffer.from("raftlease-cert-v1\0", "latin1");
/** Signed before a proof's fields. */
export const PROOF_DOMAIN = Buffer.from("raftlease-pop-v1\0", "latin1");
/** The longest certificate text parsed. */
export const MAX_CERT_CHARS = 16384;
/** Challenges kept open at once (the oldest is forgotten first), and for how long one
 *  stays valid (seconds). */
export const MAX_CHALLENGES = 10000;
export const CHALLENGE_TTL = 60;
/** Keys whose highest accepted token is remembered (the least recently used is
 *  forgotten first). */
export const MAX_TRACKED_KEYS = 100000;

/** Why a request was refused (docs/certificates.md, "What the verifier refuses"). */
export type RefusalCode =
  | "BAD_CERTIFICATE"
  | "UNKNOWN_KEY"
  | "BAD_SIGNATURE"
  | "WRONG_KEY"
  | "CERT_EXPIRED"
  | "UNKNOWN_CHALLENGE"
  | "BAD_PROOF"
  | "STALE_TOKEN";

/** A refused request; ``code`` says why (definite: the same request gets the same
 *  answer). */
export class CertificateError extends Error {
  constructor(
    message: string,
    readonly code: RefusalCode = "BAD_CERTIFICATE",
  ) {
    super(message);
    this.name = "CertificateError";
  }
}

/** What a certificate says (``parse``); ``text`` is the certificate itself. Tokens
 *  and times are bigint: they are 64-bit on the wire. */
export interface Certificate {
  kid: number;
  key: string;
  token: bigint;
  principal: string;
  units: number;
  unitIndices: number[];
  holder: Uint8Array;
  notAfterMs: bigint;
  issuedAtMs: bigint;
  op: string;
  text: string;
}

const B64URL = /^[A-Za-z0-9_-]*$/;

function unb64(text: string): Buffer {
  if (text.length === 0 || text.length % 4 === 1 || !B64URL.test(text)) {
    throw new Error("not base64url");
  }
  return Buffer.from(text, "base64url");
}

function split(text: unknown): [Buffer, Buffer] {
  if (typeof text !== "string" || text.length > MAX_CERT_CHARS) {
    throw new CertificateError("a certificate must be a string of at most 16384 characters");
  }
  const parts = text.split(".");
  if (parts.length !== 3 || parts[0] !== PREFIX) {
    throw new CertificateError(`not a certificate (expected '${PREFIX}.<body>.<signature>')`);
  }
  try {
    return [unb64(parts[1]), unb64(parts[2])];
  } catch {
    throw new CertificateError("certificate is not base64url");
  }
}

function int(value: Value | undefined, low: bigint, high: bigint): value is bigint {
  return typeof value === "bigint" && low <= value && value <= high;
}

const I31 = 2n ** 31n;
const I63 = 2n ** 63n;

/** What ``text`` says, unverified. Throws ``CertificateError`` (BAD_CERTIFICATE) for
 *  anything malformed. Fields the body has and this does not know are ignored. */
export function parse(text: unknown): Certificate {
  const [body] = split(text);
  let data: Value;
  try {
    data = decode(body);
  } catch (exc) {
    throw new CertificateError(`certificate body is not msgpack: ${(exc as Error).message}`);
  }
  // Python's `data.get("v") != 1` also lets True and 1.0 through (they equal 1 there).
  const v = data instanceof Map ? data.get("v") : undefined;
  if (!(data instanceof Map) || !(v === 1n || v === true || v === 1)) {
    throw new CertificateError("certificate body is not a version 1 map");
  }
  const kid = data.get("kid");
  const key = data.get("key");
  const token = data.get("token");
  const principal = data.get("principal");
  const units = data.get("units");
  const slots = data.get("slots");
  const holder = data.get("holder");
  const notAfter = data.get("not_after");
  const issuedAt = data.get("issued_at");
  const op = data.get("op");
  if (
    !int(kid, 1n, I31) ||
    typeof key !== "string" ||
    !int(token, 1n, I63) ||
    typeof principal !== "string" ||
    !int(units, 1n, I31) ||
    !Array.isArray(slots) ||
    !slots.every((s) => int(s, 0n, I31)) ||
    !(holder instanceof Uint8Array) ||
    holder.length !== 32 ||
    !int(notAfter, 0n, I63) ||
    !int(issuedAt, 0n, I63) ||
    typeof op !== "string"
  ) {
    throw new CertificateError("certificate body has a missing or malformed field");
  }
  return {
    kid: Number(kid),
    key,
    token,
    principal,
    units: Number(units),
    unitIndices: (slots as bigint[]).map(Number),
    holder,
    notAfterMs: notAfter,
    issuedAtMs: issuedAt,
    op,
    text: text as string,
  };
}

function sha256(data: Uint8Array): Buffer {
  return createHash("sha256").update(data).digest();
}

/** What a holder signs: PROOF_DOMAIN, SHA-256 of the certificate text (UTF-8), the
 *  challenge's length (1 byte) and bytes, SHA-256 of the request's bytes. */
export function proofMessage(certificate: string, challenge: Uint8Array, message: Uint8Array): Buffer {
  if (challenge.length > 255) {
    throw new CertificateError("a challenge is at most 255 bytes", "BAD_PROOF");
  }
  return Buffer.concat([
    PROOF_DOMAIN,
    sha256(Buffer.from(certificate, "utf8")),
    Buffer.from([challenge.length]),
    challenge,
    sha256(message),
  ]);
}

// An Ed25519 public key from its 32 raw bytes: the fixed SubjectPublicKeyInfo header
// of RFC 8410 (OID 1.3.101.112) followed by the key, which Node reads as DER.
const SPKI_ED25519 = Buffer.from("302a300506032b6570032100", "hex");

function ed25519Public(raw: Uint8Array): KeyObject {
  if (raw.length !== 32) throw new Error("an Ed25519 public key is 32 bytes");
  return createPublicKey({ key: Buffer.concat([SPKI_ED25519, raw]), format: "der", type: "spki" });
}

function ed25519Verifies(key: KeyObject, signature: Uint8Array, data: Uint8Array): boolean {
  try {
    return edVerify(null, data, key, signature);
  } catch {
    return false; // e.g. a signature of the wrong length
  }
}

/** Options of a ``Verifier``. */
export interface VerifierOptions {
  /** Seconds this resource's wall clock may run behind the signer's; a certificate is
   *  refused that long before its not_after (default 0.5). */
  driftAllowance?: number;
  /** Seconds of Unix time (default: Date.now() / 1000; tests move it). */
  clock?: () => number;
}

/** Checks certificates and proofs of possession for one resource, offline. */
export class Verifier {
  readonly driftAllowance: number;
  private readonly clock: () => number;
  private keys = new Map<number, KeyObject>();
  private readonly challenges = new Map<string, number>();
  /** The highest token accepted per key (the fence), least recently used first. */
  readonly highest = new Map<string, bigint>();

  /** ``keys``: key id -> 32 raw bytes or 64 hex characters (``raftlease cert-keys``
   *  prints them; ``loadKeys`` reads that output). Throws on a malformed key. */
  constructor(keys: Map<number, Uint8Array | string>, options: VerifierOptions = {}) {
    const drift = options.driftAllowance ?? 0.5;
    if (!(drift >= 0)) throw new RangeError("driftAllowance must be >= 0");
    this.driftAllowance = drift;
    this.clock = options.clock ?? (() => Date.now() / 1000);
    this.setKeys(keys);
  }

  /** Trust exactly ``keys`` from now on (after a rotation: fetch them again). */
  setKeys(keys: Map<number, Uint8Array | string>): void {
    const loaded = new Map<number, KeyObject>();
    for (const [kid, raw] of keys) {
      loaded.set(kid, ed25519Public(typeof raw === "string" ? Buffer.from(raw, "hex") : raw));
    }
    this.keys = loaded;
  }

  /** A fresh single-use challenge (16 random bytes) for the next request, valid for
   *  CHALLENGE_TTL seconds; at most MAX_CHALLENGES stay open (oldest forgotten). */
  challenge(): Buffer {
    const value = randomBytes(16);
    this.challenges.set(value.toString("hex"), this.clock() + CHALLENGE_TTL);
    while (this.challenges.size > MAX_CHALLENGES) {
      const oldest = this.challenges.keys().next().value as string;
      this.challenges.delete(oldest);
    }
    return value;
  }

  /** Accept one request (and raise the fence to its token), or throw
   *  ``CertificateError`` with the first failing check's code, in this order:
   *  BAD_CERTIFICATE, UNKNOWN_KEY, BAD_SIGNATURE, WRONG_KEY (when ``key`` is given),
   *  CERT_EXPIRED, UNKNOWN_CHALLENGE, BAD_PROOF, STALE_TOKEN. A check that reaches
   *  the challenge spends it. */
  check(
    certificate: string,
    proof: string,
    challenge: Uint8Array,
    message: Uint8Array = new Uint8Array(0),
    key?: string,
  ): Certificate {
    const cert = parse(certificate);
    const [body, signature] = split(certificate);
    const cluster = this.keys.get(cert.kid);
    if (cluster === undefined) {
      throw new CertificateError(`signed by key ${cert.kid}, which is not trusted`, "UNKNOWN_KEY");
    }
    if (!ed25519Verifies(cluster, signature, Buffer.concat([CERT_DOMAIN, body]))) {
      throw new CertificateError("the certificate's signature does not verify", "BAD_SIGNATURE");
    }
    if (key !== undefined && cert.key !== key) {
      throw new CertificateError(`certificate is for ${cert.key}, not ${key}`, "WRONG_KEY");
    }
    // Python compares the float (now + allowance) * 1000 with the integer exactly; a
    // not_after beyond 2**53 ms (year 287,000) is the only place Number() rounds.
    if ((this.clock() + this.driftAllowance) * 1000 >= Number(cert.notAfterMs)) {
      throw new CertificateError("the certificate has expired", "CERT_EXPIRED");
    }
    this.checkProof(cert, proof, challenge, message);
    const highest = this.highest.get(cert.key) ?? 0n;
    if (cert.token < highest) {
      throw new CertificateError(
        `token ${cert.token} for ${cert.key} is below ${highest}, already accepted`,
        "STALE_TOKEN",
      );
    }
    this.highest.delete(cert.key); // re-inserted last: most recently used
    this.highest.set(cert.key, cert.token);
    while (this.highest.size > MAX_TRACKED_KEYS) {
      this.highest.delete(this.highest.keys().next().value as string);
    }
    return cert;
  }

  private checkProof(cert: Certificate, proof: string, challenge: Uint8Array, message: Uint8Array): void {
    const id = Buffer.from(challenge).toString("hex");
    const deadline = this.challenges.get(id);
    this.challenges.delete(id);
    if (deadline === undefined || deadline < this.clock()) {
      throw new CertificateError("challenge not issued here, already used or too old", "UNKNOWN_CHALLENGE");
    }
    let ok = false;
    try {
      ok = ed25519Verifies(ed25519Public(cert.holder), unb64(proof), proofMessage(cert.text, challenge, message));
    } catch {
      ok = false; // a proof that is not base64url (or not a string) proves nothing
    }
    if (!ok) throw new CertificateError("the proof of possession does not verify", "BAD_PROOF");
  }
}

/** Keys from ``raftlease cert-keys`` output: lines of ``<kid> <64 hex>`` (blank lines
 *  and ``#`` comments skipped). Throws ``Error`` on any other line. */
export function loadKeys(text: string): Map<number, string> {
  const keys = new Map<number, string>();
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) continue;
    const match = /^(\d+) +([0-9a-fA-F]{64})$/.exec(line);
    if (match === null) throw new Error(`not a '<kid> <64 hex>' line: ${line}`);
    keys.set(Number(match[1]), match[2]);
  }
  return keys;
}
