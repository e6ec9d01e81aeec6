// A small msgpack decoder (https://github.com/msgpack/msgpack/blob/master/spec.md) for
// lease certificate bodies (docs/certificates.md, "Wire format").
//
// Why our own and not a package: a certificate body is parsed before its signature is
// checked, so this is the code hostile bytes reach first; 150 lines that decode
// exactly what the Python verifier's msgpack (raw=False, strict_map_key=True) decodes,
// and refuse exactly what it refuses, are easier to audit than a general library, and
// the verifier then has no runtime dependency at all.
//
// It decodes every msgpack type, not only those a certificate uses: a body may carry
// fields this verifier does not know (newer servers add optional ones), and those must
// be skipped as Python skips them. Refused, as Python refuses them (its errors in
// brackets): trailing bytes (ExtraData), truncated input, the never-used byte 0xc1
// (FormatError), strings that are not UTF-8 (UnicodeDecodeError), map keys other than
// str or bin (strict_map_key), more than 1024 nested arrays or maps (StackError), and
// a timestamp extension (type -1) of another length than 4, 8 or 12 bytes or with
// nanoseconds above 999,999,999.

/** A decoded msgpack value. Integers are always bigint (so 64-bit tokens stay exact
 *  and an integer is never confused with a float, which Python keeps apart too);
 *  floats are number; bin is Uint8Array; a map is a Map keyed by its str keys (bin keys
 *  are checked and then dropped: nothing here reads them). */
export type Value =
  | null
  | boolean
  | bigint
  | number
  | string
  | Uint8Array
  | Value[]
  | Map<string, Value>
  | Ext;

/** An extension value (other than a valid timestamp, which is one too). */
export class Ext {
  constructor(
    readonly type: number,
    readonly data: Uint8Array,
  ) {}
}

/** Malformed msgpack. */
export class MsgpackError extends Error {}

/** The deepest nesting of arrays and maps accepted (Python's msgpack refuses 1025). */
export const MAX_DEPTH = 1024;

const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

class Reader {
  private pos = 0;
  private readonly view: DataView;

  constructor(private readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  done(): boolean {
    return this.pos === this.bytes.length;
  }

  private need(count: number): number {
    if (this.bytes.length - this.pos < count) {
      throw new MsgpackError("truncated msgpack");
    }
    const at = this.pos;
    this.pos += count;
    return at;
  }

  private u8(): number {
    return this.view.getUint8(this.need(1));
  }

  private u16(): number {
    return this.view.getUint16(this.need(2));
  }

  private u32(): number {
    return this.view.getUint32(this.need(4));
  }

  private take(count: number): Uint8Array {
    const at = this.need(count);
    return this.bytes.subarray(at, at + count);
  }

  private str(count: number): string {
    try {
      return UTF8.decode(this.take(count));
    } catch {
      throw new MsgpackError("a msgpack str is not UTF-8");
    }
  }

  private ext(type: number, count: number): Ext {
    const data = this.take(count);
    if (type === -1) checkTimestamp(data);
    return new Ext(type, data);
  }

  private array(count: number, depth: number): Value[] {
    const out: Value[] = [];
    for (let i = 0; i < count; i++) out.push(this.value(depth + 1));
    return out;
  }

  private map(count: number, depth: number): Map<string, Value> {
    const out = new Map<string, Value>();
    for (let i = 0; i < count; i++) {
      const key = this.value(depth + 1);
      const item = this.value(depth + 1);
      if (typeof key === "string") {
        out.set(key, item); // a repeated key: the last wins, as in a Python dict
      } else if (!(key instanceof Uint8Array)) {
        throw new MsgpackError("a msgpack map key must be str or bin");
      }
    }
    return out;
  }

  value(depth: number): Value {
    const b = this.u8();
    if (b <= 0x7f) return BigInt(b);
    if (b >= 0xe0) return BigInt(b - 0x100);
    if (b >= 0xa0 && b <= 0xbf) return this.str(b & 0x1f);
    if ((b >= 0x80 && b <= 0x9f) || b === 0xdc || b === 0xdd || b === 0xde || b === 0xdf) {
      if (depth >= MAX_DEPTH) throw new MsgpackError("msgpack nested too deeply");
      if (b <= 0x8f) return this.map(b & 0x0f, depth);
      if (b <= 0x9f) return this.array(b & 0x0f, depth);
      if (b === 0xdc) return this.array(this.u16(), depth);
      if (b === 0xdd) return this.array(this.u32(), depth);
      if (b === 0xde) return this.map(this.u16(), depth);
      return this.map(this.u32(), depth);
    }
    const v = this.view;
    switch (b) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        return this.take(this.u8()).slice();
      case 0xc5:
        return this.take(this.u16()).slice();
      case 0xc6:
        return this.take(this.u32()).slice();
      case 0xc7:
      case 0xc8:
      case 0xc9: {
        const count = b === 0xc7 ? this.u8() : b === 0xc8 ? this.u16() : this.u32();
        return this.ext(v.getInt8(this.need(1)), count);
      }
      case 0xca:
        return v.getFloat32(this.need(4));
      case 0xcb:
        return v.getFloat64(this.need(8));
      case 0xcc:
        return BigInt(this.u8());
      case 0xcd:
        return BigInt(this.u16());
      case 0xce:
        return BigInt(this.u32());
      case 0xcf:
        return v.getBigUint64(this.need(8));
      case 0xd0:
        return BigInt(v.getInt8(this.need(1)));
      case 0xd1:
        return BigInt(v.getInt16(this.need(2)));
      case 0xd2:
        return BigInt(v.getInt32(this.need(4)));
      case 0xd3:
        return v.getBigInt64(this.need(8));
      case 0xd4:
      case 0xd5:
      case 0xd6:
      case 0xd7:
      case 0xd8: {
        const type = v.getInt8(this.need(1));
        return this.ext(type, 1 << (b - 0xd4));
      }
      case 0xd9:
        return this.str(this.u8());
      case 0xda:
        return this.str(this.u16());
      case 0xdb:
        return this.str(this.u32());
      default:
        throw new MsgpackError(`byte 0x${b.toString(16)} starts no msgpack value`);
    }
  }
}

function checkTimestamp(data: Uint8Array): void {
  const v = new DataView(data.buffer, data.byteOffset, data.byteLength);
  let nanoseconds = 0;
  if (data.length === 8) nanoseconds = v.getUint32(0) >>> 2;
  else if (data.length === 12) nanoseconds = v.getUint32(0);
  else if (data.length !== 4) throw new MsgpackError("invalid msgpack timestamp length");
  if (nanoseconds > 999_999_999) throw new MsgpackError("msgpack timestamp nanoseconds too large");
}

/** Decode one msgpack value that fills ``bytes`` exactly. Throws ``MsgpackError``. */
export function decode(bytes: Uint8Array): Value {
  const reader = new Reader(bytes);
  const value = reader.value(0);
  if (!reader.done()) throw new MsgpackError("extra bytes after the msgpack value");
  return value;
}
