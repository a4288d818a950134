/* Truss session report: verify the embedded bundle in the browser, offline, then show it.

   The verifier follows truss/ledger/bundle.py step by step (B1-B8 of docs/ledger-format.md,
   section 9, with the chain steps V1-V12 of section 4), so that this page and
   `truss ledger verify --bundle` reach the same result on the same bytes: Ed25519 through WebCrypto,
   SHA-256 through WebCrypto, RFC 8785 bytes rebuilt from the parsed entries, RFC 9162 proofs, C2SP
   signed notes. Only the keys in the trusted field count; the key a bundle names is reported, never
   trusted. Everything shown comes from the bundle and is written as text (textContent), never as
   HTML. The page makes no request: its Content-Security-Policy forbids every fetch.
*/
"use strict";
(function () {
  // ---------------------------------------------------------------------------- bytes and text

  const UTF8 = new TextEncoder();
  const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const B64_INDEX = new Map(Array.from(B64, (ch, i) => [ch, i]));
  const SAFE = 2n ** 53n; // canonical.INT_LIMIT: integers must lie strictly within +/-SAFE
  const SAFE_DOUBLE = 2 ** 53;

  function utf8(text) { return UTF8.encode(text); }
  function decodeUtf8(bytes) { return new TextDecoder("utf-8", { fatal: true }).decode(bytes); }
  function concat(...parts) {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) { out.set(p, at); at += p.length; }
    return out;
  }
  function hex(bytes) { return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(""); }
  function fromHex(text) {
    if (!/^(?:[0-9a-fA-F]{2})*$/.test(text)) return null;
    const out = new Uint8Array(text.length / 2);
    for (let i = 0; i < out.length; i++) out[i] = parseInt(text.substr(i * 2, 2), 16);
    return out;
  }
  function sameBytes(a, b) {
    if (a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
    return true;
  }
  function b64encode(bytes) { return btoa(binary(bytes)); }
  function binary(bytes) {
    let out = "";
    for (let i = 0; i < bytes.length; i += 0x8000) out += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return out;
  }
  // Python's base64.b64decode(text, validate=True): the alphabet and '=' only; decoding stops at a
  // complete pad; a dangling quad is an error (CPython binascii.a2b_base64, non-strict mode).
  function pyB64decode(text) {
    if (typeof text !== "string" || !/^[A-Za-z0-9+/=]*$/.test(text)) return null;
    if (text.length % 4 === 0 && /^[A-Za-z0-9+/]*={0,2}$/.test(text)) {
      // The usual shape: atob decodes it to the same bytes (unused low bits are ignored by both).
      const bin = atob(text);
      const out = new Uint8Array(bin.length);
      for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
      return out;
    }
    const out = [];
    let quad = 0, left = 0, pads = 0;
    for (const ch of text) {
      if (ch === "=") {
        if (quad >= 2 && quad + ++pads >= 4) return Uint8Array.from(out);
        continue;
      }
      const v = B64_INDEX.get(ch);
      pads = 0;
      if (quad === 0) { quad = 1; left = v; }
      else if (quad === 1) { quad = 2; out.push(((left << 2) | (v >> 4)) & 255); left = v & 15; }
      else if (quad === 2) { quad = 3; out.push(((left << 4) | (v >> 2)) & 255); left = v & 3; }
      else { quad = 0; out.push(((left << 6) | v) & 255); left = 0; }
    }
    return quad === 0 ? Uint8Array.from(out) : null;
  }
  // One byte string, one spelling: decode, and refuse any text that is not how the bytes encode.
  function b64canonical(text) {
    const raw = pyB64decode(text);
    return raw !== null && b64encode(raw) === text ? raw : null;
  }
  // DSSE allows standard or URL-safe base64, with or without padding (truss/ledger/envelope.py _b64).
  function dsseB64(text) {
    if (typeof text !== "string" || !/^[\x00-\x7f]*$/.test(text)) return null;
    let raw = text.replace(/-/g, "+").replace(/_/g, "/");
    raw += "=".repeat((4 - (raw.length % 4)) % 4);
    return pyB64decode(raw);
  }

  async function sha256(bytes) { return new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)); }

  function own(obj, key) { return Object.prototype.hasOwnProperty.call(obj, key) ? obj[key] : undefined; }
  function isObj(v) { return v !== null && typeof v === "object" && !Array.isArray(v); }

  // ---------------------------------------------------------------------------- JSON as Python reads it

  // Python tells 1 from 1.0 and keeps integers beyond 2**53 exactly; JavaScript numbers do neither.
  // The reviver sees each number's source text and marks, by holder and key, the ones that were
  // written as floats and the numbers canonical.py refuses: an integer of magnitude 2**53 or more
  // (outside I-JSON), and a float from 2**53 up to 1e21, which RFC 8785 would print as such an integer.
  const FLOATS = new WeakMap();
  const BIGS = new WeakMap();
  function mark(map, holder, key) {
    let keys = map.get(holder);
    if (keys === undefined) map.set(holder, (keys = new Set()));
    keys.add(key);
  }
  function marked(map, holder, key) { const keys = map.get(holder); return keys !== undefined && keys.has(key); }
  function isIntAt(holder, key) {
    return typeof holder[key] === "number" && !marked(FLOATS, holder, key) && !marked(BIGS, holder, key);
  }
  function parseJson(text) {
    return JSON.parse(text, function (key, value, context) {
      if (typeof value === "number" && context && typeof context.source === "string") {
        const src = context.source;
        if (/[.eE]/.test(src)) {
          mark(FLOATS, this, key);
          if (Math.abs(value) >= SAFE_DOUBLE && Math.abs(value) < 1e21) mark(BIGS, this, key);
        } else {
          const big = BigInt(src);
          if (big >= SAFE || big <= -SAFE) mark(BIGS, this, key);
        }
      }
      return value;
    });
  }
  function nestingDepth(text) {
    let depth = 0, most = 0, inString = false;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (inString) {
        if (c === 92) i++;
        else if (c === 34) inString = false;
      } else if (c === 34) inString = true;
      else if (c === 91 || c === 123) { depth++; if (depth > most) most = depth; }
      else if (c === 93 || c === 125) depth--;
    }
    return most;
  }

  // ---------------------------------------------------------------------------- RFC 8785 (truss/ledger/canonical.py)

  class CanonicalError extends Error {}
  const MAX_DEPTH = 128;
  const NON_BMP = /[\uD800-\uDBFF][\uDC00-\uDFFF]/;

  // canonical.is_plain: values the Python encoder takes its fast path for (no depth check on scalars).
  function isPlain(holder, key, depth) {
    const v = holder[key];
    if (v === null || typeof v === "string" || typeof v === "boolean") return true;
    if (typeof v === "number") return isIntAt(holder, key);
    if (depth > MAX_DEPTH) return false;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) if (!isPlain(v, String(i), depth + 1)) return false;
      return true;
    }
    for (const k of Object.keys(v)) {
      if (NON_BMP.test(k) || !isPlain(v, k, depth + 1)) return false;
    }
    return true;
  }
  function jcsString(text) {
    if (!text.isWellFormed()) throw new CanonicalError("lone surrogate in a string");
    return JSON.stringify(text);
  }
  function jcsValue(holder, key, depth, out, checkDepth) {
    if (checkDepth && depth > MAX_DEPTH) throw new CanonicalError("nesting deeper than 128");
    const v = holder[key];
    if (v === null) out.push("null");
    else if (v === true) out.push("true");
    else if (v === false) out.push("false");
    else if (typeof v === "string") out.push(jcsString(v));
    else if (typeof v === "number") {
      if (marked(BIGS, holder, key)) throw new CanonicalError("number of magnitude 2**53 or more outside I-JSON's range");
      if (!Number.isFinite(v)) throw new CanonicalError("NaN and Infinity are not JSON numbers");
      out.push(Object.is(v, -0) ? "0" : String(v));
    } else if (Array.isArray(v)) {
      out.push("[");
      for (let i = 0; i < v.length; i++) {
        if (i) out.push(",");
        jcsValue(v, String(i), depth + 1, out, checkDepth);
      }
      out.push("]");
    } else if (typeof v === "object") {
      const keys = Object.keys(v).sort(); // UTF-16 code unit order, as RFC 8785 sorts
      out.push("{");
      keys.forEach((k, i) => {
        if (i) out.push(",");
        out.push(jcsString(k), ":");
        jcsValue(v, k, depth + 1, out, checkDepth);
      });
      out.push("}");
    } else throw new CanonicalError("not a JSON value");
  }
  function canonicalText(value) {
    const holder = { "": value };
    const out = [];
    jcsValue(holder, "", 0, out, !isPlain(holder, "", 0));
    return out.join("");
  }

  // ---------------------------------------------------------------------------- Merkle proofs (truss/ledger/merkle.py)

  async function leafHash(bytes) { return sha256(concat(Uint8Array.of(0), bytes)); }
  async function nodeHash(left, right) { return sha256(concat(Uint8Array.of(1), left, right)); }
  function wellFormed(proof, ...hashes) {
    if (!Array.isArray(proof) || proof.length > 64) return false;
    return [...proof, ...hashes].every((h) => h instanceof Uint8Array && h.length === 32);
  }
  // RFC 9162 2.1.3.2; sizes and indexes as BigInt (a checkpoint may name up to 2**63 - 1 leaves).
  async function verifyInclusion(leaf, index, size, proof, root) {
    if (!wellFormed(proof, leaf, root) || !(index >= 0n && index < size)) return false;
    let fn = index, sn = size - 1n, r = leaf;
    for (const p of proof) {
      if (sn === 0n) return false;
      if ((fn & 1n) === 1n || fn === sn) {
        r = await nodeHash(p, r);
        while ((fn & 1n) === 0n && fn !== 0n) { fn >>= 1n; sn >>= 1n; }
      } else r = await nodeHash(r, p);
      fn >>= 1n; sn >>= 1n;
    }
    return sn === 0n && sameBytes(r, root);
  }
  // RFC 9162 2.1.4.2.
  async function verifyConsistency(old, size, oldRoot, newRoot, proof) {
    if (!wellFormed(proof, oldRoot, newRoot) || !(old >= 0n && old <= size)) return false;
    if (old === size) return proof.length === 0 && sameBytes(oldRoot, newRoot);
    if (old === 0n) return proof.length === 0 && sameBytes(oldRoot, await sha256(new Uint8Array(0)));
    if (proof.length === 0) return false;
    const path = [...proof];
    if ((old & (old - 1n)) === 0n) path.unshift(oldRoot);
    let fn = old - 1n, sn = size - 1n;
    while ((fn & 1n) === 1n) { fn >>= 1n; sn >>= 1n; }
    let fr = path[0], sr = path[0];
    for (const c of path.slice(1)) {
      if (sn === 0n) return false;
      if ((fn & 1n) === 1n || fn === sn) {
        fr = await nodeHash(c, fr);
        sr = await nodeHash(c, sr);
        while ((fn & 1n) === 0n && fn !== 0n) { fn >>= 1n; sn >>= 1n; }
      } else sr = await nodeHash(sr, c);
      fn >>= 1n; sn >>= 1n;
    }
    return sn === 0n && sameBytes(fr, oldRoot) && sameBytes(sr, newRoot);
  }

  // ---------------------------------------------------------------------------- keys (truss/ledger/keys.py)

  // str.isspace() in Python, character by character.
  const PY_SPACE = /[\t\n\v\f\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]/;

  async function keyIdOf(name, publicKey) {
    return (await sha256(concat(utf8(name), Uint8Array.of(10, 1), publicKey))).slice(0, 4);
  }
  class KeyError extends Error {}
  // str.strip(): Python's white space only (not U+FEFF, which JavaScript's \s holds), and by a scan
  // from each end, since /\s+$/ is quadratic in a run of spaces (the bundle's own vkey is untrusted).
  function pyStrip(text) {
    let start = 0, end = text.length;
    while (start < end && PY_SPACE.test(text[start])) start++;
    while (end > start && PY_SPACE.test(text[end - 1])) end--;
    return text.slice(start, end);
  }

  // VerifierKey.parse: <name>+<hex key id>+<base64(0x01 || 32-byte key)>, the id must match.
  async function parseVkey(text) {
    const line = pyStrip(text);
    const first = line.indexOf("+");
    const second = first < 0 ? -1 : line.indexOf("+", first + 1);
    if (second < 0) throw new KeyError(`not a verifier key: ${JSON.stringify(line.slice(0, 80))}`);
    const name = line.slice(0, first), hexId = line.slice(first + 1, second), b64 = line.slice(second + 1);
    const raw = pyB64decode(b64);
    if (raw === null) throw new KeyError(`verifier key ${JSON.stringify(name)}: the key is not valid base64`);
    if (raw.length !== 33 || raw[0] !== 1) {
      throw new KeyError(`verifier key ${JSON.stringify(name)} is not an Ed25519 key (algorithm byte 0x01 and 32 key bytes)`);
    }
    if (!name || name.length > 255 || name.includes("+") || PY_SPACE.test(name)) {
      throw new KeyError(`verifier key: key name ${JSON.stringify(name)} is not a valid signed-note key name`);
    }
    const publicKey = raw.slice(1);
    const keyId = hex(await keyIdOf(name, publicKey));
    if (keyId !== hexId.toLowerCase()) {
      throw new KeyError(`verifier key ${JSON.stringify(name)}: key id ${hexId} does not match the key (expected ${keyId})`);
    }
    let handle = null;
    try {
      handle = await crypto.subtle.importKey("raw", publicKey, { name: "Ed25519" }, false, ["verify"]);
    } catch (e) {
      handle = null; // not a point on the curve: it verifies nothing, as PyNaCl's key would verify nothing
    }
    const vkey = `${name}+${keyId}+${b64encode(raw)}`;
    return { name, keyId, publicKey, vkey, handle };
  }

  // RFC 8032, test 1: a valid public key, to tell "this browser has no Ed25519" from "a bad key".
  const RFC8032_KEY = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
  async function ed25519Supported() {
    try {
      await crypto.subtle.importKey("raw", fromHex(RFC8032_KEY), { name: "Ed25519" }, false, ["verify"]);
      return true;
    } catch (e) {
      return false;
    }
  }

  async function ed25519(key, message, signature) {
    if (key.handle === null || !(signature instanceof Uint8Array) || signature.length !== 64) return false;
    try {
      return await crypto.subtle.verify({ name: "Ed25519" }, key.handle, signature, message);
    } catch (e) {
      return false;
    }
  }

  class Trusted {
    constructor(keys) {
      this.keys = [];
      this.byId = new Map();
      for (const key of keys) {
        const group = this.byId.get(key.keyId) || [];
        if (!group.some((k) => k.name === key.name && sameBytes(k.publicKey, key.publicKey))) {
          group.push(key);
          this.keys.push(key);
        }
        this.byId.set(key.keyId, group);
      }
    }
    has(keyId) { return this.byId.has(keyId); }
    async verify(keyId, message, signature) {
      for (const key of this.byId.get(keyId) || []) if (await ed25519(key, message, signature)) return true;
      return false;
    }
  }

  async function trustedFromText(text) {
    const keys = [];
    const lines = text.split(/\r?\n/).map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
    for (const [n, line] of lines.entries()) {
      try {
        keys.push(await parseVkey(line));
      } catch (e) {
        if (e instanceof KeyError) throw new KeyError(`line ${n + 1}: ${e.message}`);
        throw e;
      }
    }
    return new Trusted(keys);
  }

  // ---------------------------------------------------------------------------- failures

  // A step failed: reason code, message, exit code as the CLI gives it (1 does not verify, 2 unusable).
  class Fail extends Error {
    constructor(reason, message, exit, extra) {
      super(message);
      this.reason = reason;
      this.exit = exit;
      Object.assign(this, extra || {});
    }
  }
  const notVerified = (reason, message, extra) => new Fail(reason, message, 1, extra);
  const unusable = (reason, message) => new Fail(reason, message, 2);

  // ---------------------------------------------------------------------------- signed notes (truss/ledger/note.py)

  const DASH = "\u2014 ";
  const MAX_NOTE_BYTES = 64 * 1024;
  const MAX_SIGNATURES = 100;
  const MAX_TREE_SIZE = 2n ** 63n - 1n;

  function checkKeyName(name) {
    if (!name || name.includes("+") || PY_SPACE.test(name) || /[\x00-\x1f]/.test(name)) {
      throw unusable("bad_key_name", `key name ${JSON.stringify(name)} is empty or holds '+' or white space`);
    }
  }
  function b64note(text, reason) {
    const raw = b64canonical(text);
    if (raw === null) throw unusable(reason, "expected canonical, padded base64");
    return raw;
  }
  function parseNote(text) {
    // JSON's "\ud800" is a lone surrogate, which has no UTF-8 form (the CLI: bad_note too).
    if (!text.isWellFormed()) throw unusable("bad_note", "a signed note is Unicode text: it holds a lone surrogate");
    if (utf8(text).length > MAX_NOTE_BYTES) throw unusable("too_large", `a signed note is at most ${MAX_NOTE_BYTES} bytes`);
    if (/[\x00-\x09\x0b-\x1f\x7f]/.test(text)) throw unusable("bad_note", "a signed note holds no control characters but newlines");
    const split = text.lastIndexOf("\n\n");
    if (split < 0) throw unusable("bad_note", "a signed note has a blank line between its text and its signatures");
    const body = text.slice(0, split + 1), block = text.slice(split + 2);
    if (!block.endsWith("\n") || !block.replace(/^\n+|\n+$/g, "")) {
      throw unusable("bad_note", "a signed note ends in at least one signature line and a newline");
    }
    const lines = block.slice(0, -1).split("\n");
    if (lines.length > MAX_SIGNATURES) throw unusable("too_many_signatures", `a signed note carries at most ${MAX_SIGNATURES} signatures`);
    const signatures = [];
    for (const line of lines) {
      if (!line.startsWith(DASH)) throw unusable("bad_note", "each signature line starts with '\u2014 ' (an em dash and a space)");
      const rest = line.slice(DASH.length);
      const space = rest.indexOf(" ");
      if (space < 0 || rest.slice(space + 1).includes(" ")) throw unusable("bad_note", "a signature line is '\u2014 <key name> <base64 signature>'");
      const name = rest.slice(0, space);
      checkKeyName(name);
      const raw = b64note(rest.slice(space + 1), "bad_note");
      if (raw.length < 5) throw unusable("bad_note", "a note signature holds a 4-byte key id and a signature");
      signatures.push({ name, keyId: raw.slice(0, 4), signature: raw.slice(4), line });
    }
    return { text: body, signatures };
  }
  async function openNote(text, trusted) {
    const note = parseNote(text);
    const message = utf8(note.text);
    const verified = [];
    for (const sig of note.signatures) {
      const candidates = trusted.keys.filter((k) => k.name === sig.name && k.keyId === hex(sig.keyId));
      sig.status = "ignored";
      if (candidates.length === 0) continue; // an unknown key, even one sharing a known name, is ignored
      let ok = false;
      for (const key of candidates) if (await ed25519(key, message, sig.signature)) { ok = true; break; }
      if (!ok) {
        sig.status = "bad";
        throw notVerified("bad_signature", `the note's signature by trusted key ${sig.name} (${hex(sig.keyId)}) does not verify`);
      }
      sig.status = "verified";
      verified.push(sig);
    }
    if (verified.length === 0) {
      const names = [...new Set(note.signatures.map((s) => s.name))].sort();
      throw notVerified("no_trusted_signature", `no signature on the note is by a trusted key (signed by: ${names.join(", ")})`);
    }
    return { note, verified };
  }
  function parseCheckpoint(text) {
    if (!text.endsWith("\n")) throw unusable("bad_checkpoint", "a checkpoint body ends in a newline");
    const lines = text.slice(0, -1).split("\n");
    if (lines.length < 3) throw unusable("bad_checkpoint", "a checkpoint has an origin line, a size line and a root line");
    const [origin, sizeText, rootText, ...extensions] = lines;
    if (!origin || /[\x00-\x20]/.test(origin)) throw unusable("bad_checkpoint", "a checkpoint's origin line is non-empty and has no spaces");
    if (!/^[0-9]+$/.test(sizeText) || (sizeText !== "0" && sizeText.startsWith("0"))) {
      throw unusable("bad_checkpoint", "a checkpoint's size is a decimal number without leading zeros");
    }
    if (sizeText.length > 19 || BigInt(sizeText) > MAX_TREE_SIZE) throw unusable("bad_checkpoint", "a checkpoint's size is out of range");
    const root = b64note(rootText, "bad_checkpoint");
    if (root.length !== 32) throw unusable("bad_checkpoint", "a checkpoint's root is the base64 of a 32-byte hash");
    if (extensions.some((l) => !l)) throw unusable("bad_checkpoint", "a checkpoint's extension lines are non-empty");
    return { origin, size: BigInt(sizeText), root, extensions };
  }
  async function openCheckpoint(text, trusted, origin) {
    const { note, verified } = await openNote(text, trusted);
    const cp = parseCheckpoint(note.text);
    if (!verified.some((s) => s.name === cp.origin)) {
      throw notVerified("no_trusted_signature", `checkpoint of ${JSON.stringify(cp.origin)} is not signed by a trusted key named after that origin`);
    }
    if (origin !== undefined && cp.origin !== origin) {
      throw notVerified("origin_mismatch", `checkpoint is for log ${JSON.stringify(cp.origin)}, expected ${JSON.stringify(origin)}`);
    }
    if (cp.extensions.length) {
      throw notVerified("checkpoint_extensions", `checkpoint of ${JSON.stringify(cp.origin)} at size ${cp.size} carries ${cp.extensions.length} extension line(s), which Truss never writes`);
    }
    return Object.assign(cp, { note });
  }

  // ---------------------------------------------------------------------------- entries (truss/ledger/entry.py, verification.py)

  const PAYLOAD_TYPE = "application/vnd.truss.ledger-entry.v1+json";
  const ENTRY_FIELDS = ["body", "index", "kind", "log", "prev", "seq", "session", "ts", "v"];
  const ZERO_HASH = "0".repeat(64);
  const HEX64 = /^[0-9a-f]{64}$/;
  const REF = /^sha256:[0-9a-f]{64}$/;
  const REORDER_LOOKAHEAD = 4096;

  function pae(type, body) {
    const t = utf8(type);
    return concat(utf8(`DSSEv1 ${t.length} `), t, utf8(` ${body.length} `), body);
  }
  function entryFromJson(item) {
    const malformed = (message) => unusable("malformed_entry", message);
    if (!isObj(item)) throw malformed("a stored entry is a JSON object with entry, hash, sig and keyid");
    const entry = own(item, "entry"), hash = own(item, "hash"), sig = own(item, "sig"), keyid = own(item, "keyid");
    if (!isObj(entry) || typeof hash !== "string" || typeof keyid !== "string") {
      throw malformed("a stored entry needs an 'entry' object and 'hash' and 'keyid' strings");
    }
    if (typeof sig !== "string") throw malformed("a stored entry's 'sig' is a base64 string");
    const sigBytes = pyB64decode(sig);
    if (sigBytes === null) throw malformed("a stored entry's 'sig' is not valid base64");
    let raw;
    try {
      raw = utf8(canonicalText(entry));
    } catch (e) {
      if (e instanceof CanonicalError) throw malformed(`a stored entry is not canonical JSON: ${e.message}`);
      throw e;
    }
    return { entry, hash, sig: sigBytes, keyid, raw };
  }
  function* iterRefs(value) {
    if (typeof value === "string") {
      if (value.length === 71 && REF.test(value)) yield value;
    } else if (Array.isArray(value)) {
      for (const item of value) yield* iterRefs(item);
    } else if (isObj(value)) {
      for (const key of Object.keys(value)) yield* iterRefs(value[key]);
    }
  }
  function refsOf(body) { return [...new Set(iterRefs(body))]; }
  function where(entry) { return `entry ${JSON.stringify(own(entry, "seq"))} of session ${JSON.stringify(own(entry, "session"))}`; }

  function parseEntryFields(item, kinds) {
    const entry = item.entry;
    const keys = Object.keys(entry).sort();
    if (keys.length !== ENTRY_FIELDS.length || keys.some((k, i) => k !== ENTRY_FIELDS[i])) {
      throw notVerified("malformed", `an entry has fields ${JSON.stringify(keys)}, expected ${JSON.stringify(ENTRY_FIELDS)}`);
    }
    const problems = [];
    if (!isIntAt(entry, "v") || entry.v !== 1) problems.push(`v is ${JSON.stringify(entry.v)}, not 1`);
    for (const name of ["log", "session", "kind"]) {
      if (typeof entry[name] !== "string" || !entry[name]) problems.push(`${name} is not a non-empty string`);
    }
    for (const name of ["seq", "index", "ts"]) {
      if (!isIntAt(entry, name) || entry[name] < 0) problems.push(`${name} is not a non-negative integer`);
    }
    if (typeof entry.kind === "string" && !kinds.has(entry.kind)) problems.push(`kind ${JSON.stringify(entry.kind)} is not a ledger entry kind`);
    if (!isObj(entry.body)) problems.push("body is not an object");
    if (typeof entry.prev !== "string" || !HEX64.test(entry.prev)) problems.push("prev is not 64 lower-case hex digits");
    if (problems.length) throw notVerified("malformed", `${where(entry)}: ${problems.join("; ")}`);
  }

  function turnsUp(items, from, session, seq) {
    for (let n = 0; from + n < items.length; n++) {
      if (n >= REORDER_LOOKAHEAD) return false;
      const e = items[from + n].entry;
      if (own(e, "session") === session) return own(e, "seq") === seq;
    }
    return false;
  }

  // verify.verify_entries for one session (not the whole log), with precomputed hashes and
  // signature results; `extra` is the V12 hook. Returns {ok, position, reason, message, ...}.
  function verifyEntries(items, facts, opts) {
    const chains = new Map();
    let lastIndex = -1, blobsChecked = 0, blobsAbsent = 0;
    for (let position = 0; position < items.length; position++) {
      const item = items[position];
      const entry = item.entry;
      let chain;
      try {
        parseEntryFields(item, opts.kinds); // V1 (V2 holds by construction: the bytes are rebuilt from the entry)
        if (entry.log !== opts.origin) throw notVerified("wrong_log", `${where(entry)}: belongs to log ${JSON.stringify(entry.log)}, not ${JSON.stringify(opts.origin)}`);
        if (facts.digest[position] !== item.hash) throw notVerified("hash_mismatch", `${where(entry)}: its stated hash does not match its bytes`); // V4
        const sid = entry.session;
        if (sid !== opts.session) throw notVerified("foreign_session", `${where(entry)}: an entry of another session among those of ${JSON.stringify(opts.session)}`); // V5
        chain = chains.get(sid);
        if (chain === undefined) chains.set(sid, (chain = { seq: -1, hash: ZERO_HASH, ended: false }));
        const expected = chain.seq + 1;
        if (entry.seq !== expected) { // V6
          if (entry.seq < expected) throw notVerified("seq_duplicate", `${where(entry)}: seq ${entry.seq} again after seq ${chain.seq} (a duplicated or replayed entry)`);
          const reordered = turnsUp(items, position + 1, sid, expected);
          throw notVerified(reordered ? "reordered" : "seq_gap", `${where(entry)}: expected seq ${expected}; ` + (reordered ? `entry ${expected} comes after it (entries out of order)` : `entry ${expected} is missing`));
        }
        if (entry.prev !== chain.hash) { // V7
          throw notVerified("prev_mismatch", `${where(entry)}: prev hash does not match ` + (chain.seq >= 0 ? `entry ${chain.seq}` : "the zero hash of a first entry"));
        }
        if ((entry.seq === 0) !== (entry.kind === "session_started")) throw notVerified("bad_start", `${where(entry)}: a session starts with session_started, and only its first entry`); // V8
        if (chain.ended) throw notVerified("after_end", `${where(entry)}: an entry after the session ended`);
        if (entry.index <= lastIndex) throw notVerified("index_order", `${where(entry)}: log index ${entry.index} is not after ${lastIndex}`); // V9
        if (!opts.trusted.has(item.keyid)) throw notVerified("untrusted_key", `${where(entry)}: signed by key ${JSON.stringify(item.keyid)}, which is not in the trusted set`); // V10
        if (!facts.signature[position]) throw notVerified("bad_signature", `${where(entry)}: the signature does not verify`);
        for (const ref of refsOf(entry.body)) { // V11
          if (!opts.blobs.has(ref)) { blobsAbsent++; continue; }
          blobsChecked++;
          if (facts.blobRef.get(ref) !== ref) throw notVerified("blob_mismatch", `${where(entry)}: the payload ${ref.slice(0, 19)}... was changed`);
        }
        const finding = opts.extra(item, position); // V12
        if (finding !== null) throw notVerified(finding[0], finding[1]);
      } catch (e) {
        if (!(e instanceof Fail)) throw e;
        const seq = own(entry, "seq"), index = own(entry, "index");
        return {
          ok: false, position, reason: e.reason, message: e.message, exit: 1,
          seq: isIntAt(entry, "seq") ? seq : null, index: isIntAt(entry, "index") ? index : null,
          blobsChecked, blobsAbsent,
        };
      }
      chain.seq = entry.seq;
      chain.hash = item.hash;
      chain.ended = entry.kind === "session_ended";
      lastIndex = entry.index;
    }
    return { ok: true, blobsChecked, blobsAbsent };
  }

  // ---------------------------------------------------------------------------- envelopes (truss/ledger/envelope.py)

  const IN_TOTO = "application/vnd.in-toto+json";
  const STATEMENT_TYPE = "https://in-toto.io/Statement/v1";
  const VERDICT_TYPE = "https://truss.dev/verdict/v1";
  const SUBJECT_PREFIX = "truss-session:";
  const STATUSES = new Set(["pass", "fail", "error"]);

  function parseEnvelope(obj) {
    const bad = (message) => unusable("bad_envelope", message);
    if (!isObj(obj)) throw bad("an envelope is a JSON object");
    // DSSE: consumers MUST ignore unrecognized fields (of the envelope and of each signature).
    const type = own(obj, "payloadType"), payload = own(obj, "payload"), signatures = own(obj, "signatures");
    if (typeof type !== "string" || !type) throw bad("an envelope's payloadType is a non-empty string");
    if (typeof payload !== "string") throw bad("an envelope's payload is a base64 string");
    if (!Array.isArray(signatures) || signatures.length === 0 || signatures.length > 16) throw bad("an envelope carries 1 to 16 signatures");
    const pairs = [];
    for (const item of signatures) {
      if (!isObj(item)) throw bad("each envelope signature is an object with keyid and sig");
      const keyid = own(item, "keyid") === undefined ? "" : own(item, "keyid");
      const sig = own(item, "sig");
      if (typeof keyid !== "string" || typeof sig !== "string") throw bad("each envelope signature has a string keyid and a base64 sig");
      const raw = dsseB64(sig);
      if (raw === null) throw bad("envelope fields are base64 (standard or URL-safe)");
      pairs.push([keyid, raw]);
    }
    const body = dsseB64(payload);
    if (body === null) throw bad("envelope fields are base64 (standard or URL-safe)");
    return { type, payload: body, signatures: pairs };
  }
  async function openVerdict(obj, trusted, session, head) {
    const env = parseEnvelope(obj);
    if (env.type !== IN_TOTO) throw notVerified("payload_type_mismatch", `envelope payload type is ${JSON.stringify(env.type)}, expected ${JSON.stringify(IN_TOTO)}`);
    const message = pae(env.type, env.payload);
    let verified = 0;
    for (const [keyid, sig] of env.signatures) {
      if (!trusted.has(keyid)) continue;
      if (!(await trusted.verify(keyid, message, sig))) throw notVerified("bad_signature", `the envelope's signature by trusted key ${keyid} does not verify`);
      verified++;
    }
    if (!verified) throw notVerified("no_trusted_signature", "no signature on the envelope is by a trusted key");
    const badStatement = (m) => notVerified("bad_statement", m);
    let st;
    try {
      st = JSON.parse(decodeUtf8(env.payload));
    } catch (e) {
      throw badStatement("the verdict payload is not JSON");
    }
    if (!isObj(st)) throw badStatement("the verdict payload is not a JSON object");
    if (own(st, "_type") !== STATEMENT_TYPE || own(st, "predicateType") !== VERDICT_TYPE) throw badStatement("the payload is not an in-toto Statement v1 with the Truss verdict predicate");
    const subjects = own(st, "subject"), pred = own(st, "predicate");
    if (!Array.isArray(subjects) || subjects.length !== 1 || !isObj(pred)) throw badStatement("a verdict statement has exactly one subject and a predicate object");
    const subject = subjects[0];
    const name = isObj(subject) ? own(subject, "name") : undefined;
    const digest = isObj(subject) ? own(subject, "digest") : undefined;
    const sha = isObj(digest) ? own(digest, "sha256") : undefined;
    if (typeof name !== "string" || !name.startsWith(SUBJECT_PREFIX) || typeof sha !== "string") throw badStatement("the verdict subject is truss-session:<id> with a sha256 digest");
    const subjectSession = name.slice(SUBJECT_PREFIX.length);
    const status = own(pred, "status"), checks = own(pred, "checks"), contractHash = own(pred, "contract_hash");
    const predHead = own(pred, "head"), checkpoint = own(pred, "checkpoint") === undefined ? null : own(pred, "checkpoint");
    if (!STATUSES.has(status) || !Array.isArray(checks) || typeof contractHash !== "string" || typeof predHead !== "string" || !(checkpoint === null || typeof checkpoint === "string")) {
      throw badStatement("the verdict predicate needs status, checks, contract_hash, head and checkpoint");
    }
    if (!HEX64.test(sha) || predHead !== sha) throw notVerified("verdict_head_mismatch", "the verdict's subject digest and predicate head differ");
    if (subjectSession !== session) throw notVerified("verdict_session_mismatch", `the verdict is about session ${subjectSession}, not ${session}`);
    if (sha !== head) throw notVerified("verdict_head_mismatch", `the verdict of session ${subjectSession} names head ${sha.slice(0, 12)}\u2026, but the session's head is ${head.slice(0, 12)}\u2026`);
    return { session: subjectSession, head: sha, status, checks, contractHash, checkpoint, statement: st };
  }

  // ---------------------------------------------------------------------------- tlog-proof (truss/ledger/bundle.py)

  const TLOG_PROOF_HEADER = "c2sp.org/tlog-proof@v1";
  function parseTlogProof(text) {
    const bad = (m) => unusable("bad_proof", m);
    if (!text.isWellFormed()) throw bad("a tlog-proof is Unicode text: it holds a lone surrogate");
    const cut = text.indexOf("\n\n");
    if (cut < 0) throw bad("a tlog-proof has a blank line before its checkpoint");
    const lines = text.slice(0, cut).split("\n"), checkpoint = text.slice(cut + 2);
    if (lines[0] !== TLOG_PROOF_HEADER) throw bad(`a tlog-proof starts with the line ${TLOG_PROOF_HEADER}`);
    let rest = lines.slice(1);
    if (rest.length && rest[0].startsWith("extra ")) {
      if (b64canonical(rest[0].slice(6)) === null) throw bad("expected canonical base64 (unused bits zero)");
      rest = rest.slice(1);
    }
    if (!rest.length || !rest[0].startsWith("index ")) throw bad("a tlog-proof names the leaf index on an 'index N' line");
    const indexText = rest[0].slice(6);
    if (!/^[0-9]+$/.test(indexText) || (indexText !== "0" && indexText.startsWith("0"))) throw bad("a tlog-proof's index is a decimal number without leading zeros");
    const hashes = rest.slice(1).map((line) => {
      const h = b64canonical(line);
      if (h === null) throw bad("expected canonical base64 (unused bits zero)");
      return h;
    });
    if (hashes.length > 64 || hashes.some((h) => h.length !== 32)) throw bad("a tlog-proof's hashes are at most 64 base64 SHA-256 hashes");
    return { index: BigInt(indexText), hashes, checkpoint };
  }

  // ---------------------------------------------------------------------------- key history (truss/ledger/keyhistory.py)

  const ROTATION_TYPE = "application/vnd.truss.key-rotation.v1+json";
  const ADMISSION_TYPE = "application/vnd.truss.key-admission.v1+json";
  const ROTATION_FIELDS = ["from_index", "key", "proof", "replaces"];
  const ADMISSION_FIELDS = ["key", "proof"];
  const REMOVAL_FIELDS = ["key"];
  const STATEMENT_KINDS = ["key_rotated", "key_admitted", "key_removed"];
  const MAX_STATEMENTS = 1000;

  function sameKey(a, b) { return a.name === b.name && sameBytes(a.publicKey, b.publicKey); }
  function covers(period, index) { return period.from <= index && (period.until === null || index < period.until); }

  // keyhistory.bundle_key_history: each key_rotated statement a bundle carries, with its inclusion proof.
  function parseKeyHistory(doc, origin) {
    const bad = (message) => unusable("bad_fields", message);
    const raw = own(doc, "key_history") === undefined ? [] : doc.key_history;
    if (!Array.isArray(raw) || raw.length > MAX_STATEMENTS) throw bad(`a bundle's key_history is a list of at most ${MAX_STATEMENTS} statements`);
    return raw.map((item) => {
      if (!isObj(item) || Object.keys(item).sort().join() !== "entry,inclusion") throw bad("a key_history item is an object with entry and inclusion");
      const entry = entryFromJson(item.entry);
      if (!STATEMENT_KINDS.includes(own(entry.entry, "kind")) || own(entry.entry, "log") !== origin) throw bad("a key_history item is a key statement (key_rotated, key_admitted, key_removed) of the bundle's log");
      const hashes = item.inclusion;
      if (!Array.isArray(hashes) || hashes.length > 64) throw bad("a key_history inclusion proof is a list of at most 64 hashes");
      const proof = hashes.map((h) => {
        const value = pyB64decode(String(h));
        if (value === null) throw bad("a key_history inclusion proof holds base64 hashes");
        if (value.length !== 32) throw bad("a key_history inclusion proof holds 32-byte hashes");
        return value;
      });
      return { item: entry, proof };
    });
  }

  // keyhistory._admit_or_remove: a key_admitted or key_removed statement (of this log, its hash checked) applied to `periods`.
  async function admitOrRemove(item, periods, origin, index) {
    const entry = item.entry;
    const at = `${entry.kind} statement at log index ${index}`;
    const where = { session: "@log", seq: own(entry, "seq"), index };
    const forged = (m) => notVerified("forged_admission", `${at}: ${m}`, where);
    const bad = (m) => notVerified("bad_admission", `${at}: ${m}`, where);
    const body = isObj(own(entry, "body")) ? entry.body : {};
    const payload = pae(PAYLOAD_TYPE, item.raw);
    let signer = null;
    for (const p of periods) {
      if (p.key.keyId === item.keyid && (await ed25519(p.key, payload, item.sig))) { signer = p; break; }
    }
    if (signer === null) return; // signed by a key the verifier does not start from: the key it names stays unknown
    if (signer.role !== "log") throw forged(`it is signed by the worker key ${signer.key.keyId}; only a log key changes the key set`);
    if (!covers(signer, index)) throw forged(`it is signed by key ${signer.key.keyId}, which was retired before index ${index}`);
    const fields = entry.kind === "key_admitted" ? ADMISSION_FIELDS : REMOVAL_FIELDS;
    if (Object.keys(body).sort().join() !== fields.join()) throw bad(`its body has the fields ${JSON.stringify(fields)}`);
    let named;
    try {
      named = await parseVkey(String(body.key));
    } catch (e) {
      if (e instanceof KeyError) throw bad("its key cannot be parsed");
      throw e;
    }
    if (named.name !== origin) throw bad(`the key is named ${JSON.stringify(named.name)}; every key of the log is named ${JSON.stringify(origin)}`);
    const known = periods.map((p, i) => (sameKey(p.key, named) ? i : -1)).filter((i) => i >= 0);
    if (entry.kind === "key_removed") {
      const open = known.find((i) => periods[i].role === "worker" && periods[i].until === null);
      if (open === undefined) throw bad(`it removes key ${named.keyId}, which is not an admitted worker key`);
      periods[open] = { ...periods[open], until: index + 1 };
      return;
    }
    const proof = pyB64decode(String(body.proof));
    if (proof === null) throw bad("its proof is not base64");
    const statement = utf8(canonicalText({ log: origin, key: named.vkey }));
    if (!(await ed25519(named, pae(ADMISSION_TYPE, statement), proof))) throw bad("the worker key's proof does not verify (its holder did not ask to join)");
    if (known.some((i) => periods[i].statement !== null)) throw bad(`key ${named.keyId} was already admitted to, rotated in or removed from the log`);
    if (!known.length) periods.push({ key: named, from: index + 1, until: null, statement: item, role: "worker" }); // a key trusted from the start keeps that trust
  }

  // keyhistory.follow_rotations (K1-K6): the periods of every key, followed from the trusted ones:
  // rotations, and admissions and removals of worker keys (which sign entries, never checkpoints).
  async function followRotations(statements, trusted, origin) {
    const periods = trusted.keys.map((key) => ({ key, from: 0, until: null, statement: null, role: "log" }));
    for (const { item } of statements) {
      const entry = item.entry;
      const at = `rotation statement at log index ${own(entry, "index")}`;
      const where = { session: "@log", seq: own(entry, "seq"), index: own(entry, "index") };
      const forged = (m) => notVerified("forged_rotation", `${at}: ${m}`, where);
      const bad = (m) => notVerified("bad_rotation", `${at}: ${m}`, where);
      if (!isIntAt(entry, "index") || entry.log !== origin) throw bad("it is not an entry of this log");
      const index = entry.index;
      if (hex(await sha256(item.raw)) !== item.hash) throw bad("its bytes or hash do not match the entry"); // K1
      if (entry.kind !== "key_rotated") {
        await admitOrRemove(item, periods, origin, index);
        continue;
      }
      const payload = pae(PAYLOAD_TYPE, item.raw);
      const body = isObj(own(entry, "body")) ? entry.body : {};
      let signer = -1;
      for (let i = 0; i < periods.length && signer < 0; i++) {
        if (periods[i].key.keyId === item.keyid && (await ed25519(periods[i].key, payload, item.sig))) signer = i;
      }
      if (signer < 0) { // K2
        if (periods.some((p) => p.key.vkey === own(body, "replaces"))) throw forged(`it rotates a trusted key but is signed by another one (key id ${item.keyid})`);
        continue; // a statement about keys before the ones trusted: the verifier starts after it
      }
      const old = periods[signer];
      if (!covers(old, index)) throw forged(`it is signed by key ${old.key.keyId}, which was retired before index ${index}`);
      if (Object.keys(body).sort().join() !== ROTATION_FIELDS.join()) throw bad(`its body has the fields ${JSON.stringify(ROTATION_FIELDS)}`);
      if (body.replaces !== old.key.vkey) throw forged("the key it says it replaces is not the key that signed it"); // K3
      if (!isIntAt(body, "from_index") || body.from_index !== index + 1) throw bad(`from_index is ${JSON.stringify(body.from_index)}, not its own index + 1 (${index + 1})`); // K4
      let key, proof;
      try {
        key = await parseVkey(String(body.key));
      } catch (e) {
        if (e instanceof KeyError) throw bad("its new key or proof cannot be parsed");
        throw e;
      }
      proof = pyB64decode(String(body.proof));
      if (proof === null) throw bad("its new key or proof cannot be parsed");
      if (key.name !== origin) throw bad(`the new key is named ${JSON.stringify(key.name)}; a rotated key keeps the origin ${JSON.stringify(origin)}`);
      const statement = utf8(canonicalText({ log: origin, key: key.vkey, replaces: old.key.vkey, from_index: index + 1 }));
      if (!(await ed25519(key, pae(ROTATION_TYPE, statement), proof))) { // K5
        throw bad("the new key's proof does not verify (it names a key whose holder did not accept it)");
      }
      const known = periods.filter((p) => sameKey(p.key, key));
      if (sameKey(key, old.key) || known.some((p) => p.statement !== null)) throw bad("the new key is a key the log already rotated to or from");
      periods[signer] = { ...old, until: index + 1 }; // K6
      if (!known.length) periods.push({ key, from: index + 1, until: null, statement: item, role: old.role }); // a worker's successor is a worker
    }
    const rotations = periods.filter((p) => p.statement !== null).length;
    const ids = periods.map((p) => p.key.keyId);
    const shared = new Set(ids.filter((id, i) => ids.indexOf(id) !== i));
    return { periods, rotations, shared, trusted: new Trusted(periods.map((p) => p.key)) };
  }

  // KeyHistory.check (V12): the entry is signed by a key whose period covers its index.
  async function keySpan(history, item) {
    const index = item.entry.index;
    const valid = history.periods.filter((p) => p.key.keyId === item.keyid && covers(p, index));
    if (valid.length && !history.shared.has(item.keyid)) return null; // V10 already checked the signature
    for (const p of valid) if (await ed25519(p.key, pae(PAYLOAD_TYPE, item.raw), item.sig)) return null;
    const spans = history.periods.filter((p) => p.key.keyId === item.keyid).map((p) => `[${p.from}, ${p.until === null ? "..." : p.until})`).join(", ");
    return ["retired_key", `entry ${item.entry.seq} of session ${JSON.stringify(item.entry.session)} (log index ${index}) is signed by key ${item.keyid}, which signs only log indexes ${spans || "none"}`];
  }
  // KeyHistory.open_verdict: after a rotation, only a key that signs at the session's last entry signed its verdict.
  async function openVerdictAt(envelope, history, trusted, session, head) {
    if (!history.rotations) return openVerdict(envelope, trusted, session, head.hash);
    const atHead = new Trusted(history.periods.filter((p) => covers(p, head.entry.index)).map((p) => p.key));
    try {
      return await openVerdict(envelope, atHead, session, head.hash);
    } catch (e) {
      if (!(e instanceof Fail)) throw e;
      await openVerdict(envelope, trusted, session, head.hash); // a key of the log at all?
      throw notVerified("retired_key", `the verdict envelope is signed by a key of the log that no longer signed at log index ${head.entry.index} (the session's last entry): it was rotated away before`);
    }
  }
  // KeyHistory.checkpoint_keys: the log keys that may sign a checkpoint of `size` (a worker key never signs one).
  function checkpointKeys(history, size) {
    return new Trusted(history.periods.filter((p) => p.role === "log" && BigInt(p.from) <= size && (p.until === null || size <= BigInt(p.until))).map((p) => p.key));
  }

  // ---------------------------------------------------------------------------- the bundle, B1-B8

  const BUNDLE_FORMAT = "truss-bundle";
  const BUNDLE_KEYS = ["blobs", "checkpoint", "consistency", "entries", "envelope", "format", "inclusion", "origin", "payloads", "proof", "session", "version", "vkey"];
  const MAX_BUNDLE_BYTES = 256 * 1024 * 1024;
  const MAX_BUNDLE_ENTRIES = 1000000;
  // Where CPython's json module gives up (RecursionError) under `truss ledger verify`: about 988
  // levels, a little less or more with the depth of the stack it is called from.
  const MAX_NESTING = 987;

  function decodeHashes(value) {
    if (!Array.isArray(value) || value.length > 64) throw unusable("bad_proof", "a proof is a list of at most 64 base64 hashes");
    const hashes = value.map((h) => {
      if (typeof h !== "string") return new Uint8Array(0);
      const raw = b64canonical(h);
      if (raw === null) throw unusable("bad_proof", "expected canonical base64 (unused bits zero)");
      return raw;
    });
    if (hashes.some((h) => h.length !== 32)) throw unusable("bad_proof", "a proof holds base64 SHA-256 hashes");
    return hashes;
  }
  function parseBundle(bytes) {
    if (bytes.length > MAX_BUNDLE_BYTES) throw unusable("too_large", `a bundle is at most ${MAX_BUNDLE_BYTES} bytes, this one is ${bytes.length}`);
    let text, doc;
    try {
      text = decodeUtf8(bytes);
    } catch (e) {
      throw unusable("not_json", "a bundle is one JSON object");
    }
    if (nestingDepth(text) > MAX_NESTING) throw unusable("too_deep", "a bundle nests too deeply to be read");
    try {
      doc = parseJson(text);
    } catch (e) {
      throw unusable("not_json", "a bundle is one JSON object");
    }
    if (!isObj(doc)) throw unusable("not_json", "a bundle is one JSON object");
    if (own(doc, "format") !== BUNDLE_FORMAT) throw unusable("wrong_format", `not a Truss bundle (format is not '${BUNDLE_FORMAT}')`);
    const version = own(doc, "version");
    if (version !== 1 && version !== true) throw unusable("wrong_version", `bundle version ${JSON.stringify(version)} is not supported (expected 1)`);
    const keys = Object.keys(doc);
    const unknown = keys.filter((k) => !BUNDLE_KEYS.includes(k) && k !== "key_history").sort();
    const missing = BUNDLE_KEYS.filter((k) => !keys.includes(k));
    if (unknown.length || missing.length) throw unusable("bad_fields", `bundle fields: unknown ${JSON.stringify(unknown)}, missing ${JSON.stringify(missing)}`);
    for (const name of ["origin", "session", "vkey", "checkpoint", "proof"]) {
      if (typeof doc[name] !== "string" || !doc[name]) throw unusable("bad_fields", `a bundle's ${name} is a non-empty string`);
    }
    if (typeof doc.payloads !== "boolean") throw unusable("bad_fields", "a bundle's payloads flag is true or false");
    if (!Array.isArray(doc.entries) || doc.entries.length > MAX_BUNDLE_ENTRIES) throw unusable("bad_fields", `a bundle's entries are a list of at most ${MAX_BUNDLE_ENTRIES}`);
    if (doc.envelope !== null && !isObj(doc.envelope)) throw unusable("bad_fields", "a bundle's envelope is an object or null");
    if (!isObj(doc.blobs)) throw unusable("bad_fields", "a bundle's blobs are an object of ref -> base64");
    const blobs = new Map();
    for (const ref of Object.keys(doc.blobs)) {
      const data = doc.blobs[ref];
      if (typeof data !== "string") throw unusable("bad_fields", "a bundle's blobs are an object of ref -> base64");
      const raw = b64canonical(data);
      if (raw === null) throw unusable("bad_fields", "expected canonical base64 (unused bits zero)");
      blobs.set(ref, raw);
    }
    if (!Array.isArray(doc.inclusion)) throw unusable("bad_proof", "a bundle's inclusion proofs are a list, one per entry");
    const inclusion = doc.inclusion.map(decodeHashes);
    const consistency = doc.consistency === null ? null : decodeHashes(doc.consistency);
    return { doc, blobs, inclusion, consistency };
  }

  async function vkeyTrusted(vkey, trusted) {
    try {
      const key = await parseVkey(vkey);
      return (trusted.byId.get(key.keyId) || []).some((k) => k.name === key.name && sameBytes(k.publicKey, key.publicKey));
    } catch (e) {
      if (e instanceof KeyError) return false;
      throw e;
    }
  }

  const STEPS = [
    ["B1", "parse", "one JSON object in the bundle format, every field of its type, base64 where promised"],
    ["B2", "trust", "only the keys in the trusted field count, and the key rotations and worker keys the bundle carries followed from them; the key the bundle names is only reported"],
    ["B3", "checkpoint", "the checkpoint is a signed note by a trusted key named after the log's origin (after a rotation, a log key allowed at its size)"],
    ["B4", "entries", "each entry: signature, hash, seq and prev chain, start and end, payload hashes, inclusion proof in the checkpoint"],
    ["B5", "head proof", "the tlog-proof proves the session's last entry in the same checkpoint"],
    ["B6", "payloads", "every payload included is named by an entry"],
    ["B7", "verdict", "the verdict envelope is signed by a trusted key, about this session and its last entry"],
    ["B8", "one log", "the verdict's checkpoint and the bundle's describe one log (no fork)"],
  ];

  // verify_bundle: run B1-B8 over the bytes, never throw for bad or tampered input.
  async function verifyBundle(bytes, trusted, kinds) {
    const started = performance.now();
    const out = { ok: false, step: null, reason: null, message: null, exit: 0, seq: null, index: null, position: null,
      facts: {}, parsed: null, items: [], statuses: [], checkpoint: null, statement: null, blobState: new Map(), reached: "B1" };
    let step = "B1";
    try {
      // B1
      const parsed = parseBundle(bytes);
      out.parsed = parsed;
      const { doc, blobs, inclusion } = parsed;
      const session = doc.session, origin = doc.origin;
      Object.assign(out.facts, { session, origin });
      // B2: the key history the bundle carries is followed from the trusted keys.
      step = "B2";
      out.facts.vkeyTrusted = await vkeyTrusted(doc.vkey, trusted);
      const statements = parseKeyHistory(doc, origin);
      const history = await followRotations(statements, trusted, origin);
      const rootTrust = trusted;
      trusted = history.trusted;
      // B3: signed by a key allowed at its size; every rotation statement is a leaf of it.
      step = "B3";
      const signers = history.rotations ? checkpointKeys(history, parseCheckpoint(parseNote(doc.checkpoint).text).size) : rootTrust;
      const checkpoint = await openCheckpoint(doc.checkpoint, signers, origin);
      out.checkpoint = checkpoint;
      Object.assign(out.facts, { checkpointSize: checkpoint.size, checkpointRoot: hex(checkpoint.root) });
      for (const { item, proof } of statements) {
        const index = BigInt(item.entry.index);
        if (index >= checkpoint.size || !(await verifyInclusion(await leafHash(item.raw), index, checkpoint.size, proof, checkpoint.root))) {
          throw notVerified("not_in_log", `the rotation statement at log index ${index} is not in the checkpoint`);
        }
      }
      // B4: parse every entry first (as StoredEntry.from_json does), then the chain with its V12 hook.
      step = "B4";
      const items = [];
      for (const [position, raw] of doc.entries.entries()) {
        try {
          items.push(entryFromJson(raw));
        } catch (e) {
          if (e instanceof Fail) e.position = position;
          throw e;
        }
      }
      out.items = items;
      if (inclusion.length !== items.length) throw notVerified("proof_count", "the bundle holds a different number of proofs than entries");
      const facts = await precompute(items, blobs, inclusion, checkpoint, trusted);
      const spans = history.rotations ? await Promise.all(items.map((item) => keySpan(history, item))) : null;
      const chain = verifyEntries(items, facts, {
        kinds, trusted, blobs, session, origin,
        extra: (item, position) => {
          const index = BigInt(item.entry.index);
          if (index >= checkpoint.size) return ["not_in_log", `entry ${item.entry.seq}: log index ${index} is beyond the checkpoint of size ${checkpoint.size}`];
          if (!facts.included[position]) return ["not_in_log", `entry ${item.entry.seq}: it is not the leaf at log index ${index} of the checkpointed tree`];
          return spans === null ? null : spans[position];
        },
      });
      for (const [ref, got] of facts.blobRef) out.blobState.set(ref, got === ref ? "checked" : "changed");
      if (!chain.ok) {
        throw Object.assign(notVerified(chain.reason, chain.message), { seq: chain.seq, index: chain.index, position: chain.position });
      }
      if (items.length === 0) throw notVerified("empty", "the bundle holds no entries");
      const head = items[items.length - 1];
      Object.assign(out.facts, { entries: items.length, head: head.hash, blobsChecked: chain.blobsChecked, blobsAbsent: chain.blobsAbsent });
      // B5
      step = "B5";
      const proof = parseTlogProof(doc.proof);
      if (proof.checkpoint !== doc.checkpoint) throw notVerified("proof_checkpoint", "the tlog-proof carries another checkpoint than the bundle");
      if (proof.index !== BigInt(head.entry.index) || !(await verifyInclusion(facts.leaf[items.length - 1], proof.index, checkpoint.size, proof.hashes, checkpoint.root))) {
        throw notVerified("bad_inclusion_proof", `the tlog-proof does not prove the session head (log index ${head.entry.index})`);
      }
      // B6
      step = "B6";
      const named = new Set(items.flatMap((item) => refsOf(item.entry.body)));
      const stray = [...blobs.keys()].filter((ref) => !named.has(ref)).sort();
      if (stray.length) throw notVerified("unreferenced_blob", `payload ${stray[0].slice(0, 19)}... is not named by any entry`);
      // B7
      step = "B7";
      if (doc.envelope !== null) {
        const statement = await openVerdictAt(doc.envelope, history, trusted, session, head);
        const recorded = items.filter((item) => item.entry.kind === "verdict");
        if (recorded.length) {
          const status = own(recorded[recorded.length - 1].entry.body, "status");
          if (status !== statement.status) throw notVerified("verdict_mismatch", `the verdict envelope says ${JSON.stringify(statement.status)} but the session recorded ${JSON.stringify(status)}`);
        }
        out.statement = statement;
        out.facts.verdict = statement.status;
        // B8
        if (statement.checkpoint !== null) {
          step = "B8";
          // As in B3, only a key allowed at its size: one rotated away before it does not sign for the log.
          const namedSigners = history.rotations ? checkpointKeys(history, parseCheckpoint(parseNote(statement.checkpoint).text).size) : trusted;
          const namedCp = await openCheckpoint(statement.checkpoint, namedSigners, checkpoint.origin);
          if (namedCp.size === checkpoint.size) {
            if (!sameBytes(namedCp.root, checkpoint.root)) throw notVerified("fork", `two checkpoints of size ${namedCp.size} with different roots: the log was forked`);
          } else {
            const [small, large] = namedCp.size < checkpoint.size ? [namedCp, checkpoint] : [checkpoint, namedCp];
            if (parsed.consistency === null || !(await verifyConsistency(small.size, large.size, small.root, large.root, parsed.consistency))) {
              throw notVerified("inconsistent_checkpoints", `the checkpoints of size ${small.size} and ${large.size} are not proven to be one log`);
            }
          }
        }
      }
      out.ok = true;
      out.reached = "done";
    } catch (e) {
      if (!(e instanceof Fail)) throw e;
      Object.assign(out, { step, reason: e.reason, message: e.message, exit: e.exit, reached: step });
      if (Number.isInteger(e.seq)) out.seq = e.seq;
      if (Number.isInteger(e.index)) out.index = e.index;
      if (Number.isInteger(e.position)) out.position = e.position;
    }
    out.statuses = entryStatuses(out);
    out.ms = performance.now() - started;
    return out;
  }

  // The hashing and signature checks of B4 for every entry, at once: they do not depend on each
  // other, so they run in parallel; verifyEntries then applies them in order and stops where Python stops.
  async function precompute(items, blobs, inclusion, checkpoint, trusted) {
    const digest = new Array(items.length), leaf = new Array(items.length);
    const signature = new Array(items.length), included = new Array(items.length);
    await Promise.all(items.map(async (item, i) => {
      const [d, l] = await Promise.all([sha256(item.raw), leafHash(item.raw)]);
      digest[i] = hex(d);
      leaf[i] = l;
      const index = typeof item.entry.index === "number" && Number.isInteger(item.entry.index) ? BigInt(item.entry.index) : -1n;
      const [sigOk, inc] = await Promise.all([
        trusted.has(item.keyid) ? trusted.verify(item.keyid, pae(PAYLOAD_TYPE, item.raw), item.sig) : false,
        index >= 0n && index < checkpoint.size ? verifyInclusion(l, index, checkpoint.size, inclusion[i], checkpoint.root) : false,
      ]);
      signature[i] = sigOk;
      included[i] = inc;
    }));
    const blobRef = new Map();
    await Promise.all([...blobs].map(async ([ref, data]) => { blobRef.set(ref, "sha256:" + hex(await sha256(data))); }));
    return { digest, leaf, signature, included, blobRef };
  }

  // Per entry, in bundle order: "verified" (passed B4), "failed" (where verification stopped) or
  // "unchecked" (never reached, or stopped before entries could be trusted).
  function entryStatuses(result) {
    const n = result.parsed ? result.parsed.doc.entries.length : 0;
    const statuses = new Array(n).fill("unchecked");
    const order = ["B1", "B2", "B3", "B4"];
    if (result.ok || !order.includes(result.step)) return statuses.fill("verified");
    if (result.step === "B4" && result.position !== null) {
      if (result.exit === 1) statuses.fill("verified", 0, result.position);
      statuses[result.position] = "failed";
    }
    return statuses;
  }

  // ---------------------------------------------------------------------------- the view

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else node.setAttribute(k, String(v));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const SVG_NS = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
    for (const child of children.flat()) if (child !== null && child !== undefined) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    return node;
  }
  function body(id) { const node = document.querySelector(`#${id} .body`); node.replaceChildren(); return node; }
  function pill(text, cls) { return el("span", { class: `pill ${cls}` }, text); }
  function facts(pairs) {
    return el("dl", { class: "facts" }, pairs.filter((p) => p).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  }
  function str(v) { return typeof v === "string" ? v : v === undefined || v === null ? "" : JSON.stringify(v); }
  function pretty(v) { try { return JSON.stringify(v, null, 2); } catch (e) { return String(v); } }
  function shortRef(v) { return typeof v === "string" && v.length > 19 ? v.slice(0, 19) + "\u2026" : str(v); }
  function duration(ms) {
    if (typeof ms !== "number" || !Number.isFinite(ms) || ms < 0) return "";
    if (ms < 1000) return `${Math.round(ms)} ms`;
    if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
    const part = (n, unit) => (n ? ` ${n} ${unit}` : "");
    if (ms < 3600000) return `${Math.floor(ms / 60000)} min` + part(Math.round((ms % 60000) / 1000), "s");
    return `${Math.floor(ms / 3600000)} h` + part(Math.round((ms % 3600000) / 60000), "min");
  }
  function utc(ts) {
    if (typeof ts !== "number" || !Number.isFinite(ts)) return "";
    try { return new Date(ts).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC"); } catch (e) { return ""; }
  }
  function parseDuration(text) {
    const m = /^\s*(\d+)(ms|s|m|h|d)\s*$/.exec(typeof text === "string" ? text : "");
    return m ? Number(m[1]) * { ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000 }[m[2]] : null;
  }

  // What the page knows of a bundle it could parse: entries as the bundle holds them, and payloads.
  function viewOf(result) {
    const doc = result.parsed.doc;
    const rows = doc.entries.map((item, position) => {
      const entry = isObj(item) && isObj(own(item, "entry")) ? item.entry : {};
      const b = isObj(own(entry, "body")) ? entry.body : {};
      return { position, item, entry, body: b, seq: own(entry, "seq"), ts: own(entry, "ts"), kind: str(own(entry, "kind")) };
    });
    const started = rows.find((r) => r.kind === "session_started");
    const effective = started && isObj(own(started.body, "effective")) ? started.body.effective : {};
    const payload = (ref) => {
      if (typeof ref !== "string" || !result.parsed.blobs.has(ref)) return { state: "absent" };
      const bytes = result.parsed.blobs.get(ref);
      const state = result.blobState.get(ref) || "unchecked";
      try { return { state, value: JSON.parse(decodeUtf8(bytes)), bytes: bytes.length }; }
      catch (e) { return { state, value: undefined, bytes: bytes.length }; }
    };
    // The last suspension before each row, in one pass (a row looking back for it is quadratic).
    let suspended = null;
    const suspendedBefore = rows.map((r) => { const before = suspended; if (r.kind === "session_suspended") suspended = r; return before; });
    return { doc, rows, started, effective, payload, suspendedBefore, bySeq: new Map(rows.map((r) => [r.seq, r])) };
  }

  function outcomeOf(row, view) {
    const b = row.body;
    switch (row.kind) {
      case "session_started":
        return own(b, "start_failure") ? ["start failed", "bad"] : [`${Object.keys(isObj(own(b, "pins")) ? b.pins : {}).length} tools mounted`, "ok"];
      case "model_turn": {
        const usage = isObj(own(b, "usage")) ? b.usage : {};
        const calls = own(b, "tool_calls");
        return [`${str(own(b, "stop_reason")) || "answered"}, ${calls === undefined ? 0 : calls} call(s), ${(own(usage, "input_tokens") || 0) + (own(usage, "output_tokens") || 0)} tokens`, "neutral"];
      }
      case "mcp_tool_intent": return ["sent", "neutral"];
      case "mcp_tool_call": {
        const failure = own(b, "failure");
        if (isObj(failure)) return [`failed (${str(own(failure, "cause"))})`, "bad"];
        if (own(b, "is_error") === true) return ["tool error", "bad"];
        const source = own(b, "replayed_from") ? " (memo)" : own(b, "resolved") !== undefined ? " (resolved)" : own(b, "signal") !== undefined ? " (signal)" : own(b, "task") !== undefined ? " (task)" : "";
        return ["ok" + source, "ok"];
      }
      case "mcp_tool_denied": return [`denied (${str(own(b, "code"))})`, "bad"];
      case "mcp_tool_pending": return [`pending (${str(own(b, "kind"))})`, "wait"];
      case "signal_received": return [own(b, "is_error") === true ? "delivered (error)" : "delivered", "ok"];
      case "approval_requested": return ["waiting for a person", "wait"];
      case "approval_decided": return own(b, "approved") === true ? ["approved", "ok"] : ["refused", "bad"];
      case "in_doubt": return ["in doubt", "wait"];
      case "in_doubt_resolved": return [`resolved: ${str(own(b, "resolution"))}`, "ok"];
      case "session_suspended": return [`suspended (${str(own(b, "reason"))})`, "wait"];
      case "session_resumed": return ["resumed", "neutral"];
      case "verdict": {
        const checks = Array.isArray(own(b, "checks")) ? b.checks : [];
        const passed = checks.filter((c) => isObj(c) && c.ok === true).length;
        return [`${str(own(b, "status"))} (${passed}/${checks.length} checks)`, own(b, "status") === "pass" ? "ok" : "bad"];
      }
      case "session_ended": return [str(own(b, "status")), own(b, "status") === "pass" ? "ok" : own(b, "status") === "suspended" ? "wait" : "bad"];
      case "panel_review": {
        const outcome = str(own(b, "outcome"));
        const cause = isObj(own(b, "failure")) ? ` (${str(own(b.failure, "cause"))})` : "";
        return [outcome + cause, outcome === "approve" ? "ok" : "bad"];
      }
      case "sandbox_egress": {
        const decision = str(own(b, "decision")) || "recorded";
        const text = own(b, "summary") === true ? `${decision} \u00d7 ${str(own(b, "attempts"))}` : decision;
        return [text, decision === "allowed" ? "ok" : /refus|denied|fail/.test(decision) ? "bad" : "neutral"];
      }
      default: {
        // A kind this page does not know (a later Truss's): shown as recorded, never dropped.
        for (const k of ["decision", "outcome", "effect", "status", "action"]) if (typeof own(b, k) === "string") return [b[k], /deny|denied|block|refus/i.test(b[k]) ? "bad" : "neutral"];
        if (typeof own(b, "allowed") === "boolean") return b.allowed ? ["allowed", "ok"] : ["denied", "bad"];
        return ["recorded", "neutral"];
      }
    }
  }
  const LABELS = {
    session_started: "session started", model_turn: "model turn", mcp_tool_intent: "call sent", mcp_tool_call: "call result",
    mcp_tool_denied: "call denied", mcp_tool_pending: "call pending", signal_received: "signal received",
    approval_requested: "approval requested", approval_decided: "approval decided", in_doubt: "in doubt",
    in_doubt_resolved: "in-doubt resolved", session_suspended: "session suspended", session_resumed: "session resumed",
    verdict: "verdict", session_ended: "session ended", sandbox_egress: "egress decision", panel_review: "panel review",
  };
  function detailOf(row, view) {
    const b = row.body;
    switch (row.kind) {
      case "session_started": return [str(own(b, "contract")), str(own(b, "provider")) && `provider ${str(b.provider)}`, own(b, "start_failure") && str(own(b.start_failure, "message") || b.start_failure)].filter(Boolean).join(" \u00b7 ");
      case "model_turn": {
        const response = view.payload(own(b, "response"));
        const text = isObj(response.value) && typeof response.value.text === "string" ? response.value.text : "";
        const calls = isObj(response.value) && Array.isArray(response.value.tool_calls) ? response.value.tool_calls.map((c) => isObj(c) ? str(c.name) : "").join(", ") : "";
        return [calls && `asks for ${calls}`, text && `says: ${text.length > 200 ? text.slice(0, 200) + "\u2026" : text}`].filter(Boolean).join(" \u00b7 ");
      }
      case "mcp_tool_denied": return [str(own(b, "reason")), own(b, "limit") !== undefined && `limit ${str(b.limit)}`].filter(Boolean).join(" \u00b7 ");
      case "approval_requested": return str(own(b, "reason"));
      case "approval_decided": return [own(b, "by") && `by ${str(b.by)}`, str(own(b, "reason"))].filter(Boolean).join(": ");
      case "session_suspended": return Array.isArray(own(b, "calls")) && b.calls.length ? `waiting on ${b.calls.map(str).join(", ")}` : "";
      case "session_resumed": return own(b, "from_seq") !== undefined ? `continues from seq ${str(b.from_seq)}` : "";
      case "mcp_tool_pending": return own(b, "signal") !== undefined ? `signal ${str(b.signal)}` : own(b, "task") !== undefined ? `task ${str(b.task)}` : "";
      case "signal_received": return own(b, "signal") !== undefined ? `signal ${str(b.signal)}` : "";
      case "verdict": return str(own(b, "reason"));
      case "panel_review": return [`${str(own(b, "name"))} (${[str(own(b, "provider")), str(own(b, "model"))].filter(Boolean).join(" ")})`,
        `check ${str(own(b, "check"))}`, str(own(b, "reason"))].filter(Boolean).join(" \u00b7 ");
      case "sandbox_egress": {
        const port = own(b, "port");
        const target = `${str(own(b, "host"))}${port !== undefined ? ":" + str(port) : ""}`;
        const bytes = typeof own(b, "bytes_up") === "number" ? `${b.bytes_up} B up, ${typeof own(b, "bytes_down") === "number" ? b.bytes_down : 0} B down` : "";
        return [own(b, "server") !== undefined && `server ${str(b.server)}`, `${str(own(b, "method"))} ${target}`.trim(),
          own(b, "reason") !== undefined && `reason ${str(b.reason)}`, bytes, own(b, "summary") === true && "summary of attempts past the flood bound"].filter(Boolean).join(" \u00b7 ");
      }
      default:
        if (LABELS[row.kind]) return "";
        return (() => { const t = JSON.stringify(b); return t.length > 240 ? t.slice(0, 240) + "\u2026" : t; })();
    }
  }
  function durationOf(row, view, rows) {
    const b = row.body, ts = row.ts;
    const since = (seq) => { const other = view.bySeq.get(seq); return other && typeof other.ts === "number" ? ts - other.ts : undefined; };
    switch (row.kind) {
      case "mcp_tool_call": return typeof own(b, "duration_ms") === "number" ? [duration(b.duration_ms), "recorded by the gate"] : ["", ""];
      case "approval_decided": return [duration(since(own(b, "request"))), "waited for the decision"];
      case "in_doubt_resolved": return [duration(since(own(b, "in_doubt"))), "in doubt for"];
      case "signal_received": return [duration(since(own(b, "pending"))), "pending for"];
      case "session_resumed": {
        const before = view.suspendedBefore[row.position];
        return before ? [duration(ts - before.ts), "suspended for"] : ["", ""];
      }
      case "model_turn": {
        const prev = rows[row.position - 1];
        return prev && typeof prev.ts === "number" ? ["\u2248 " + duration(ts - prev.ts), "time since the entry before"] : ["", ""];
      }
      case "session_ended": return rows.length && typeof rows[0].ts === "number" ? [duration(ts - rows[0].ts), "whole session"] : ["", ""];
      case "sandbox_egress": return typeof own(b, "duration_ms") === "number" ? [duration(b.duration_ms), "connection, measured by the egress proxy"] : ["", ""];
      default: return ["", ""];
    }
  }
  const STATUS_TEXT = { verified: "\u2713 verified", failed: "\u2717 not verified", unchecked: "\u2013 not checked" };
  const STATUS_CLASS = { verified: "ok", failed: "bad", unchecked: "muted" };

  function renderTimeline(view, result) {
    const node = body("timeline");
    const first = view.rows.length && typeof view.rows[0].ts === "number" ? view.rows[0].ts : null;
    const tbody = el("tbody");
    for (const row of view.rows) {
      const [outcome, cls] = outcomeOf(row, view);
      const [dur, durWhy] = durationOf(row, view, view.rows);
      const status = result.statuses[row.position] || "unchecked";
      const call = str(own(row.body, "call"));
      const tool = str(own(row.body, "tool"));
      const label = LABELS[row.kind] || row.kind || "(no kind)";
      const rowCls = [status === "failed" ? "failed" : "", { ok: "row-ok", bad: row.kind === "mcp_tool_denied" ? "row-denied" : "row-failed", wait: "row-waiting" }[cls] || ""].join(" ");
      tbody.append(el("tr", { class: rowCls, "data-pos": row.position, "data-seq": row.seq, "data-kind": row.kind, "data-status": status },
        el("td", { class: "num" }, str(row.seq)),
        el("td", { class: "time", title: utc(row.ts) }, first !== null && typeof row.ts === "number" ? `+${((row.ts - first) / 1000).toFixed(3)} s` : ""),
        el("td", {}, el("span", { class: LABELS[row.kind] ? "" : "mono" }, label), el("span", { class: "sub" }, detailOf(row, view))),
        el("td", { class: "mono" }, call),
        el("td", { class: "mono" }, tool),
        el("td", { class: `outcome ${cls}` }, outcome),
        el("td", { class: "dur", title: durWhy }, dur),
        el("td", { class: `vstate ${STATUS_CLASS[status]}`, title: status === "failed" ? str(result.message) : "" }, STATUS_TEXT[status])));
    }
    node.append(el("p", { class: "muted" }, `${view.rows.length} entries, in the order the session recorded them. Times are from the entries' timestamps (UTC on hover); a call's duration is the one the gate recorded.`));
    node.append(el("table", { class: "timeline" },
      el("thead", {}, el("tr", {}, ["seq", "time", "event", "call", "tool", "outcome", "duration", "verification"].map((h) => el("th", {}, h)))),
      tbody));
  }

  function ruleText(view, index) {
    const rules = isObj(own(view.effective, "policy")) && Array.isArray(view.effective.policy.rules) ? view.effective.policy.rules : [];
    const rule = Number.isInteger(index) && index >= 0 && index < rules.length && isObj(rules[index]) ? rules[index] : null;
    if (!rule) return `rule ${str(index)}`;
    const args = isObj(rule.args) && Object.keys(rule.args).length ? ` when ${Object.keys(rule.args).sort().join(", ")} match` : "";
    return `rule ${index}: ${str(rule.tool)} \u2192 ${str(rule.effect)}${args}${rule.reason ? ` (\u201c${str(rule.reason)}\u201d)` : ""}`;
  }
  function payloadBlock(view, ref, what) {
    if (typeof ref !== "string") return el("span", { class: "muted" }, "not recorded");
    const p = view.payload(ref);
    if (p.state === "absent") return el("span", { class: "muted" }, `${shortRef(ref)}: not in this bundle (erased, or exported without payloads)`);
    const note = p.state === "checked" ? "hash checked" : p.state === "changed" ? "DOES NOT MATCH its hash" : "not checked";
    const parts = [el("div", { class: `muted ${p.state === "changed" ? "bad" : ""}` }, `${shortRef(ref)} \u00b7 ${p.bytes} bytes \u00b7 ${note}`)];
    const v = p.value;
    if (what === "result" && isObj(v)) {
      const texts = Array.isArray(v.content) ? v.content.filter((c) => isObj(c) && c.type === "text" && typeof c.text === "string").map((c) => c.text) : [];
      if (texts.length) parts.push(el("div", { class: "muted" }, "text content:"), el("pre", { class: "result-text" }, texts.join("\n")));
      if (v.structuredContent !== undefined) parts.push(el("div", { class: "muted" }, "structured content:"), el("pre", {}, pretty(v.structuredContent)));
      const other = Array.isArray(v.content) ? v.content.filter((c) => !(isObj(c) && c.type === "text")) : [];
      if (other.length) parts.push(el("div", { class: "muted" }, "other content:"), el("pre", {}, pretty(other)));
      if (v.isError === true) parts.push(el("div", { class: "bad" }, "the tool answered isError"));
    } else if (v !== undefined) parts.push(el("pre", {}, pretty(v)));
    else parts.push(el("span", { class: "muted" }, "not JSON"));
    return el("div", {}, parts);
  }

  function renderCalls(view, result, derived) {
    const node = body("calls");
    const calls = new Map();
    for (const row of view.rows) {
      const call = own(row.body, "call");
      if (typeof call !== "string" || row.kind === "session_suspended") continue;
      if (!calls.has(call)) calls.set(call, []);
      calls.get(call).push(row);
    }
    if (!calls.size) { node.append(el("p", { class: "muted" }, "This session made no tool calls.")); return; }
    const pins = view.started && isObj(own(view.started.body, "pins")) ? view.started.body.pins : {};
    for (const [call, rows] of calls) {
      const tool = str(own(rows[0].body, "tool"));
      const final = rows.filter((r) => ["mcp_tool_call", "mcp_tool_denied"].includes(r.kind)).pop() || rows[rows.length - 1];
      const [outcome, cls] = outcomeOf(final, view);
      const kinds = (k) => rows.filter((r) => r.kind === k);
      const statuses = rows.map((r) => result.statuses[r.position]);
      const vstate = statuses.includes("failed") ? "failed" : statuses.every((s) => s === "verified") ? "verified" : "unchecked";
      const argsRef = rows.map((r) => own(r.body, "args")).find((a) => typeof a === "string");
      const resultRef = kinds("mcp_tool_call").map((r) => own(r.body, "result")).pop();
      const pin = rows.map((r) => own(r.body, "pin")).find((p) => typeof p === "string");
      const denial = kinds("mcp_tool_denied").pop();
      const asked = kinds("approval_requested")[0];
      const decided = kinds("approval_decided").pop();
      const policy = denial
        ? `denied (${str(own(denial.body, "code"))})` + (own(denial.body, "rule") !== undefined ? ` by ${ruleText(view, denial.body.rule)}` : "") + `: ${str(own(denial.body, "reason"))}`
        : asked ? `approval required by ${ruleText(view, own(asked.body, "rule"))}` : "allowed (allowed calls record no rule; see the decision path)";
      const budget = denial && own(denial.body, "code") === "budget" ? `refused by limit ${str(own(denial.body, "limit"))}` : denial ? "not charged (refused before the budget)" : kinds("mcp_tool_intent").length || own(final.body, "replayed_from") ? "charged one call" : "not charged";
      const approval = asked ? (decided ? `${own(decided.body, "approved") === true ? "approved" : "refused"}${own(decided.body, "by") ? ` by ${str(decided.body.by)}` : ""}${own(decided.body, "reason") ? `: \u201c${str(decided.body.reason)}\u201d` : ""} (seq ${str(decided.seq)})` : `requested at seq ${str(asked.seq)}, not decided`) : "not needed";
      const pinText = typeof pin === "string" ? `${pin}${pins[tool] === pin ? " (the pin recorded when the session started)" : pins[tool] ? " (DIFFERS from the pin recorded at start)" : ""}` : "none recorded";
      const dur = kinds("mcp_tool_call").map((r) => own(r.body, "duration_ms")).find((d) => typeof d === "number");
      // The panel's content is built when it is first opened: a long session has thousands of calls.
      const build = () => {
      const inner = el("div", { class: "inner" },
        facts([
          ["tool", el("span", { class: "mono" }, tool)],
          ["turn", str(own(rows[0].body, "turn"))],
          ["outcome", el("span", { class: cls }, outcome)],
          ["policy", policy],
          ["budget", budget],
          ["approval", approval],
          ["pin", el("span", { class: "hash" }, pinText)],
          ["entries", rows.map((r) => `${str(r.seq)} ${r.kind}`).join(", ")],
          ["arguments", payloadBlock(view, argsRef, "args")],
          ["result", resultRef !== undefined ? payloadBlock(view, resultRef, "result") : el("span", { class: "muted" }, "no result recorded")],
        ]));
      const explanation = derived && isObj(derived[call]) ? derived[call] : null;
      if (explanation) {
        inner.append(el("h3", {}, "Decision path ", el("span", { class: "derived" }, "from truss ledger why")),
          el("ol", { class: "path" }, (explanation.steps || []).map((s) => el("li", {},
            el("span", { class: "step" }, str(s.step)), str(s.text),
            s.derived ? el("span", { class: "derived", title: "not recorded itself: re-derived from the recorded contract, arguments and entries" }, "re-derived") : null,
            Array.isArray(s.seqs) && s.seqs.length ? el("span", { class: "muted" }, ` [${s.seqs.length === 1 ? "seq" : "seqs"} ${s.seqs.join(", ")}]`) : null))));
      }
      return inner;
      };
      const panel = el("details", { class: "call", "data-call": call, "data-status": vstate, "data-decision-path": derived && isObj(derived[call]) ? "yes" : "no" },
        el("summary", {}, el("span", { class: "mono" }, call), " \u00b7 ", el("span", { class: "mono" }, tool), " \u00b7 ",
          el("span", { class: cls }, outcome), dur !== undefined ? ` \u00b7 ${duration(dur)}` : "", " \u00b7 ",
          el("span", { class: `vstate ${STATUS_CLASS[vstate]}` }, STATUS_TEXT[vstate])));
      let built = false;
      panel.fill = () => { if (!built) { built = true; panel.append(build()); } };
      panel.addEventListener("toggle", () => { if (panel.open) panel.fill(); });
      node.append(panel);
    }
  }
  // Open every panel, building what is not built yet (for printing, and for the tests).
  function expandAll() {
    for (const panel of document.querySelectorAll("details")) {
      if (typeof panel.fill === "function") panel.fill();
      panel.open = true;
    }
  }

  function renderVerdict(view, result) {
    const node = body("verdict");
    const row = [...view.rows].reverse().find((r) => r.kind === "verdict");
    if (!row) {
      const ended = view.rows.find((r) => r.kind === "session_ended");
      node.append(el("p", { id: "verdict-status", class: "wait" }, ended ? "The session ended without a verdict entry." : "No verdict yet: the session has not ended (it is suspended or still running)."));
      return;
    }
    const status = str(own(row.body, "status"));
    const checks = Array.isArray(own(row.body, "checks")) ? row.body.checks : [];
    const error = isObj(own(row.body, "error")) ? row.body.error : null;
    const envelope = result.statement ? `signed verdict envelope verified (status ${result.statement.status})` : view.doc.envelope ? "the verdict envelope did not verify (see Verification)" : "no verdict envelope in the bundle";
    node.append(el("p", {}, el("span", { id: "verdict-status", class: `pill ${status === "pass" ? "ok" : "bad"}` }, status.toUpperCase()), " ",
      `${checks.filter((c) => isObj(c) && c.ok === true).length} of ${checks.length} checks passed \u00b7 recorded at seq ${str(row.seq)} \u00b7 ${envelope}`));
    if (own(row.body, "reason")) node.append(el("p", {}, str(row.body.reason)));
    if (error) node.append(el("p", { class: "bad" }, `error: ${str(error.cause)}${error.limit ? ` (limit ${str(error.limit)})` : ""}: ${str(error.detail)}`));
    if (checks.length) {
      node.append(el("table", { class: "checks" },
        el("thead", {}, el("tr", {}, ["#", "check", "tool", "result", "detail"].map((h) => el("th", {}, h)))),
        el("tbody", {}, checks.map((c, i) => isObj(c) ? el("tr", { "data-ok": c.ok === true },
          el("td", { class: "num" }, str(c.index !== undefined ? c.index : i)), el("td", { class: "mono" }, str(c.kind)), el("td", { class: "mono" }, str(c.tool)),
          el("td", { class: c.ok === true ? "ok" : "bad" }, c.ok === true ? "ok" : "FAIL"), el("td", {}, str(c.detail))) : null))));
    }
    checks.forEach((c, i) => { if (isObj(c) && isObj(own(c, "panel"))) node.append(renderPanel(c, i)); });
  }

  // A panel check's claims, the calls they cite, Truss's findings and each reviewer's answer, as the
  // verdict entry records them (truss.contract.panel). Everything from the record is shown as text.
  function renderPanel(check, position) {
    const p = check.panel;
    const list = (v) => (Array.isArray(v) ? v.filter(isObj) : []);
    const cited = new Map(list(own(p, "cited")).map((c) => [str(own(c, "call")), c]));
    const index = own(check, "index") !== undefined ? check.index : position;
    const box = el("div", { class: "panel", "data-check": str(index), "data-outcome": str(own(p, "outcome")) },
      el("h3", {}, `Panel (check ${str(index)}): `, pill(str(own(p, "outcome")), check.ok === true ? "ok" : "bad"), " ",
        `${str(own(p, "approvals"))} approval(s), quorum ${str(own(p, "quorum"))}`));
    const citeOf = (id) => {
      const call = cited.get(str(id));
      const label = call ? `${str(id)} (${str(own(call, "status"))}, seq ${str(own(call, "seq"))})` : `${str(id)} (not in the session)`;
      const cls = call && own(call, "status") === "ok" ? "ok" : "bad";
      return el("span", { class: `sub ${cls}`, title: call ? `entry ${str(own(call, "hash"))}` : "" }, label);
    };
    const claimRow = (c) => el("tr", { "data-claim": str(own(c, "claim")) },
      el("td", { class: "num" }, str(own(c, "claim"))), el("td", {}, str(own(c, "text"))),
      el("td", { class: "mono" }, (Array.isArray(own(c, "cites")) ? c.cites : []).map(citeOf)));
    const claims = list(own(p, "claims"));
    if (claims.length) {
      box.append(el("table", { class: "claims" },
        el("thead", {}, el("tr", {}, ["claim", "text", "cites"].map((h) => el("th", {}, h)))),
        el("tbody", {}, claims.map(claimRow))));
    }
    const findings = list(own(p, "findings"));
    if (findings.length) {
      box.append(el("ul", { class: "findings" }, findings.map((f) => el("li", { class: "bad" }, `${str(own(f, "finding"))}: ${str(own(f, "detail"))}`))));
    }
    const judgement = (j) => el("span", { class: "sub" },
      `${str(own(j, "claim"))}: ${str(own(j, "judgement"))} [${(Array.isArray(own(j, "calls")) ? j.calls : []).map(str).join(", ")}]`);
    const reviewerRow = (r) => el("tr", { "data-reviewer": str(own(r, "name")), "data-outcome": str(own(r, "outcome")) },
      el("td", { class: "mono" }, str(own(r, "name"))),
      el("td", {}, [str(own(r, "provider")), str(own(r, "model"))].filter(Boolean).join(" ")),
      el("td", { class: own(r, "outcome") === "approve" ? "ok" : "bad" }, str(own(r, "outcome")) + (own(r, "cause") ? ` (${str(r.cause)})` : "")),
      el("td", {}, str(own(r, "reason"))),
      el("td", { class: "mono" }, list(own(r, "judgements")).map(judgement)));
    const reviewers = list(own(p, "reviewers"));
    if (reviewers.length) {
      box.append(el("table", { class: "reviewers" },
        el("thead", {}, el("tr", {}, ["reviewer", "model", "outcome", "reason", "judgements"].map((h) => el("th", {}, h)))),
        el("tbody", {}, reviewers.map(reviewerRow))));
    }
    return box;
  }

  function renderBudget(view) {
    const node = body("budget");
    const budget = isObj(own(view.effective, "budget")) ? view.effective.budget : {};
    const agent = isObj(own(view.effective, "agent")) ? view.effective.agent : {};
    const chargeMemo = own(budget, "charge_memo_hits") !== false;
    const turnLimit = [own(budget, "max_model_turns"), own(agent, "max_turns")].filter((n) => typeof n === "number").reduce((a, b) => Math.min(a, b), Infinity);
    const deadline = parseDuration(own(budget, "deadline"));
    const series = [
      { name: "tool calls", limit: own(budget, "max_tool_calls"), setting: "budget.max_tool_calls", points: [] },
      { name: "model turns", limit: Number.isFinite(turnLimit) ? turnLimit : undefined, setting: "budget.max_model_turns", points: [] },
      { name: "tokens", limit: own(budget, "max_tokens"), setting: "budget.max_tokens", points: [] },
      { name: "time (this leg)", limit: deadline, setting: "budget.deadline", points: [], unit: "ms" },
    ];
    const charged = new Set();
    let turns = 0, tokens = 0, legStart = null;
    for (const row of view.rows) {
      const b = row.body, call = own(b, "call");
      if (row.kind === "session_started" || row.kind === "session_resumed") legStart = row.ts;
      if (typeof call === "string" && !charged.has(call) && (row.kind === "mcp_tool_intent" || (row.kind === "mcp_tool_call" && own(b, "replayed_from") && chargeMemo))) charged.add(call);
      if (row.kind === "model_turn") turns++;
      if (row.kind === "model_turn" || row.kind === "panel_review") {  // a panel's reviewers spend the run's tokens too
        const usage = isObj(own(b, "usage")) ? b.usage : {};
        for (const k of ["input_tokens", "output_tokens"]) if (Number.isInteger(own(usage, k)) && usage[k] > 0) tokens += usage[k];
      }
      const elapsed = typeof legStart === "number" && typeof row.ts === "number" ? row.ts - legStart : 0;
      [charged.size, turns, tokens, elapsed].forEach((used, i) => series[i].points.push([row.position, used]));
    }
    const shown = series.filter((s) => typeof s.limit === "number" && s.limit > 0);
    const W = 860, H = 260, L = 48, R = 34, T = 14, B = 34;
    const n = Math.max(view.rows.length - 1, 1);
    // A loop, not Math.max(...points): spreading a long session's points overflows the stack.
    let top = 100;
    for (const s of shown) for (const [, u] of s.points) top = Math.max(top, (100 * u) / s.limit);
    const x = (p) => L + ((W - L - R) * p) / n;
    const y = (pct) => T + (H - T - B) * (1 - pct / top);
    const chart = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "budget used over the run, as a share of each limit" });
    chart.append(svg("title", {}, "Budget used over the run, as a share of each limit"));
    for (const pct of [0, 25, 50, 75, 100]) {
      chart.append(svg("line", { class: pct === 100 ? "limit" : "grid", x1: L, x2: W - R, y1: y(pct), y2: y(pct) }));
      chart.append(svg("text", { x: L - 6, y: y(pct) + 4, "text-anchor": "end" }, `${pct}%`));
    }
    const ticks = Math.min(8, view.rows.length);
    for (let i = 0; i < ticks; i++) {
      const p = Math.round((n * i) / Math.max(ticks - 1, 1));
      const row = view.rows[p];
      if (row) chart.append(svg("text", { x: x(p), y: H - B + 16, "text-anchor": "middle" }, `seq ${str(row.seq)}`));
    }
    chart.append(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "entries of the session, in order"));
    shown.forEach((s) => {
      const idx = series.indexOf(s);
      chart.append(svg("polyline", { class: `s${idx}`, points: s.points.map(([p, u]) => `${x(p).toFixed(1)},${y((100 * u) / s.limit).toFixed(1)}`).join(" ") }));
    });
    node.append(el("p", { class: "muted" }, "Each line is what the run had used, after each entry, as a share of its limit (the dashed line is the limit). Calls count when they are charged (at their intent, or a memo hit when budget.charge_memo_hits); time restarts at every resume, as the deadline does."));
    node.append(el("div", { class: "legend" }, shown.map((s) => el("span", {}, el("span", { class: `swatch s${series.indexOf(s)}` }), `${s.name} (limit ${s.unit === "ms" ? duration(s.limit) : s.limit})`))));
    node.append(chart);
    node.append(el("table", { class: "budget-table" },
      el("thead", {}, el("tr", {}, ["limit", "setting", "used", "limit", "share"].map((h) => el("th", {}, h)))),
      el("tbody", {}, series.map((s) => {
        const used = s.points.length ? s.points[s.points.length - 1][1] : 0;
        const has = typeof s.limit === "number" && s.limit > 0;
        return el("tr", {}, el("td", {}, s.name), el("td", { class: "mono" }, s.setting),
          el("td", { class: "num" }, s.unit === "ms" ? duration(used) : String(used)),
          el("td", { class: "num" }, has ? (s.unit === "ms" ? duration(s.limit) : String(s.limit)) : "none"),
          el("td", { class: "num" }, has ? `${Math.round((100 * used) / s.limit)}%` : ""));
      }))));
  }

  async function renderContract(view) {
    const node = body("contract");
    if (!view.started) { node.append(el("p", { class: "muted" }, "The bundle holds no session_started entry.")); return; }
    const b = view.started.body;
    let check = "";
    try {
      const got = "sha256:" + hex(await sha256(utf8(canonicalText(view.effective))));
      check = got === own(b, "contract_hash") ? "the recorded effective contract hashes to it" : `the recorded effective contract hashes to ${got}, NOT to this`;
    } catch (e) {
      check = "the recorded effective contract has no canonical form";
    }
    const servers = isObj(own(b, "servers")) ? b.servers : {};
    node.append(facts([
      ["contract", str(own(b, "contract"))],
      ["hash", el("span", {}, el("span", { class: "hash" }, str(own(b, "contract_hash"))), el("span", { class: "sub muted" }, check))],
      ["provider", str(own(b, "provider"))],
      ["truss", str(own(b, "truss_version"))],
      own(b, "principal") !== undefined ? ["principal", str(b.principal)] : null,
      ["servers", Object.keys(servers).map((name) => `${name} (${str(own(servers[name], "transport"))}, ${str(own(servers[name], "protocol_version"))})`).join(", ") || "none"],
      ["pins", el("pre", {}, pretty(own(b, "pins") || {}))],
    ]));
    node.append(el("details", {}, el("summary", {}, "The effective contract, as recorded at seq 0"), el("div", { class: "inner" }, el("pre", {}, pretty(view.effective)))));
  }

  function renderCheckpoint(view, result) {
    const node = body("checkpoint");
    const text = str(view.doc.checkpoint);
    const cp = result.checkpoint;
    let signatures = [];
    try { signatures = parseNote(text).signatures; } catch (e) { signatures = []; }
    const verified = new Set(cp ? cp.note.signatures.filter((s) => s.status === "verified").map((s) => s.line) : []);
    node.append(facts([
      ["log", str(view.doc.origin)],
      ["tree size", cp ? String(cp.size) : "not verified"],
      ["root", cp ? el("span", { class: "hash" }, hex(cp.root)) : "not verified"],
      ["bundle's key", el("span", {}, el("span", { class: "hash" }, str(view.doc.vkey)), el("span", { class: "sub muted" }, result.facts.vkeyTrusted ? "one of the trusted keys" : "not among the trusted keys (informational only: it never adds trust)"))],
    ]));
    node.append(el("pre", { class: "note" }, text));
    if (signatures.length) {
      node.append(el("table", { class: "signatures" },
        el("thead", {}, el("tr", {}, ["signature line", "key name", "key id", "status"].map((h) => el("th", {}, h)))),
        el("tbody", {}, signatures.map((s, i) => {
          const isLog = s.name === view.doc.origin;
          const role = isLog ? "log signature" : "other signer (a witness cosignature, or another key)";
          const state = verified.has(s.line) ? ["verified under a trusted key", "ok"] : isLog ? ["not verified", "bad"] : ["not checked: no trusted key for it", "muted"];
          return el("tr", {}, el("td", {}, `${i + 1}: ${role}`), el("td", { class: "mono" }, s.name), el("td", { class: "mono" }, hex(s.keyId)), el("td", { class: state[1] }, state[0]));
        }))));
    }
  }

  function renderSteps(result) {
    const tbody = document.querySelector("#steps tbody");
    tbody.replaceChildren();
    const failedAt = result.ok ? null : result.step;
    let passed = true;
    for (const [id, name, what] of STEPS) {
      let state, cls;
      if (failedAt === id) { state = `failed: ${result.reason}`; cls = "bad"; passed = false; }
      else if (!passed) { state = "not reached"; cls = "muted"; }
      else if ((id === "B7" || id === "B8") && result.parsed && result.parsed.doc.envelope === null) { state = "no verdict envelope in the bundle"; cls = "muted"; }
      else if (id === "B8" && result.statement && result.statement.checkpoint === null) { state = "the verdict names no checkpoint"; cls = "muted"; }
      else if (id === "B2") { state = result.facts.vkeyTrusted ? "the bundle's key is trusted" : "the bundle's key is not trusted (it adds no trust)"; cls = "neutral"; }
      else { state = "passed"; cls = "ok"; }
      tbody.append(el("tr", { "data-step": id }, el("td", { class: "mono" }, `${id} ${name}`), el("td", {}, what), el("td", { class: cls }, state)));
    }
  }

  function renderOverall(result, keys) {
    const node = document.getElementById("overall");
    node.replaceChildren();
    if (result.ok) {
      node.className = "banner ok";
      node.append("Verified", el("span", { class: "detail" },
        `All ${result.facts.entries} entries verify under ${keys.keys.length === 1 ? "the trusted key" : `the ${keys.keys.length} trusted keys`}: signatures, hash chain, inclusion in the checkpoint of size ${result.facts.checkpointSize}, the head's proof` +
        (result.statement ? ", the verdict envelope" : "") + `; ${result.facts.blobsChecked} payload(s) re-hashed, ${result.facts.blobsAbsent} not included. Checked in ${Math.round(result.ms)} ms.`));
    } else {
      node.className = "banner bad";
      const at = result.position !== null && result.seq !== null ? ` at entry seq ${result.seq}` : result.position !== null ? ` at entry ${result.position + 1} of the bundle` : "";
      node.append(`Not verified${at}`, el("span", { class: "detail" }, `${result.step} (${result.reason}): ${result.message}` + (result.exit === 2 ? " (the bundle cannot be read: unusable input)" : "")));
    }
    node.dataset.ok = String(result.ok);
  }

  function renderSummary(result, view) {
    const node = document.getElementById("summary");
    node.replaceChildren();
    const item = (k, v) => el("div", { class: "item" }, el("span", { class: "k" }, k), el("span", { class: "v" }, v));
    const verdict = view ? [...view.rows].reverse().find((r) => r.kind === "verdict") : null;
    const ended = view ? view.rows.find((r) => r.kind === "session_ended") : null;
    const status = verdict ? str(own(verdict.body, "status")) : ended ? str(own(ended.body, "status")) : "running or suspended";
    node.append(
      item("verification", pill(result.ok ? "VERIFIED" : "NOT VERIFIED", result.ok ? "ok" : "bad")),
      item("session", el("span", { class: "mono", id: "session-id" }, view ? str(view.doc.session) : "?")),
      view && view.started ? item("contract", str(own(view.started.body, "contract"))) : null,
      item("verdict", pill(status, status === "pass" ? "ok" : verdict ? "bad" : "wait")),
      view ? item("entries", String(view.rows.length)) : null,
      view && view.rows.length ? item("started", utc(view.rows[0].ts)) : null);
    if (view) document.title = `Truss report: session ${str(view.doc.session)}`;
  }

  async function render(result, keys, derived) {
    renderOverall(result, keys);
    renderSteps(result);
    const view = result.parsed ? viewOf(result) : null;
    renderSummary(result, view);
    const sections = ["verdict", "timeline", "calls", "budget", "contract", "checkpoint"];
    if (!view) {
      for (const id of sections) body(id).append(el("p", { class: "muted" }, "Nothing to show: the bundle could not be read."));
      return;
    }
    // The decision paths came from `truss ledger why` for the embedded bundle; another bundle gets none.
    const head = result.items.length ? result.items[result.items.length - 1].hash : null;
    const paths = derived && derived.session === view.doc.session && derived.head === head ? derived.calls : null;
    renderVerdict(view, result);
    renderTimeline(view, result);
    renderCalls(view, result, paths);
    renderBudget(view);
    await renderContract(view);
    renderCheckpoint(view, result);
  }

  // ---------------------------------------------------------------------------- the page

  const config = JSON.parse(document.getElementById("truss-config").textContent);
  const KINDS = new Set(config.kinds);
  const embedded = pyB64decode(document.getElementById("truss-bundle").textContent.replace(/\s+/g, "")) || new Uint8Array(0);
  let current = { bytes: embedded, derived: config.derived };
  let runs = 0;
  const waiters = [];

  // One check at a time, in the order they were asked for (a file is queued when it is chosen, not
  // when it has been read): a slow check never draws its result over the one of a bundle chosen after it.
  let queue = Promise.resolve();
  function run(bytes, keyText, derived) {
    const next = queue.then(() => check(bytes, keyText, derived));
    queue = next.catch(() => {});
    return next;
  }

  async function check(bytes, keyText, derived) {
    const note = document.getElementById("keys-note");
    let keys;
    try {
      keys = await trustedFromText(keyText);
      note.textContent = keys.keys.length ? `${keys.keys.length} key(s): ${keys.keys.map((k) => `${k.name} (${k.keyId})`).join(", ")}` : "No trusted key: nothing can verify.";
      note.className = keys.keys.length ? "muted" : "bad";
    } catch (e) {
      if (!(e instanceof KeyError)) throw e;
      note.textContent = `Not a verifier key, ${e.message}. Nothing was verified.`;
      note.className = "bad";
      keys = new Trusted([]);
    }
    document.documentElement.dataset.state = "running";
    let summary;
    try {
      if (!(globalThis.crypto && crypto.subtle)) {
        throw new Error("WebCrypto is not available to this page (open the file itself, or serve it over https)");
      }
      if (!(await ed25519Supported())) {
        throw new Error("this browser's WebCrypto has no Ed25519, so no signature can be checked here (current Chromium, Firefox and Safari have it)");
      }
      const result = await verifyBundle(await bytes, keys, KINDS);
      await render(result, keys, derived);
      summary = {
        ok: result.ok, step: result.step, reason: result.reason, message: result.message, exit: result.exit,
        seq: result.seq, index: result.index, position: result.position, statuses: result.statuses, ms: result.ms,
        session: result.facts.session || null, verdict: result.facts.verdict || null, at: performance.now(),
      };
    } catch (e) {
      // A fault of this page, not of the bundle: say so, and claim nothing.
      const node = document.getElementById("overall");
      node.className = "banner bad";
      node.replaceChildren("Not verified: the page failed", el("span", { class: "detail" }, `${e && e.name}: ${e && e.message}. Check the bundle with truss ledger verify --bundle.`));
      summary = { ok: false, step: null, reason: "page_error", message: String(e && e.message), exit: 0, seq: null, index: null, position: null, statuses: [], ms: 0, session: null, verdict: null };
    }
    document.documentElement.dataset.state = "done";
    runs++;
    api.last = summary;
    while (waiters.length && waiters[0].n < runs) waiters.shift().resolve(summary);
    return summary;
  }

  const api = {
    last: null,
    // For the tests and the benchmark: resolves with the summary of the first verification after `n` runs.
    after(n) { return runs > n ? Promise.resolve(api.last) : new Promise((resolve) => waiters.push({ n, resolve })); },
    expandAll,
    get runs() { return runs; },
  };
  window.trussReport = api;

  const keyField = document.getElementById("trusted-keys");
  keyField.value = (config.trusted || []).join("\n");
  document.getElementById("footer").textContent =
    `Made by truss ${config.truss_version} with \`truss ledger report\`. Its checks follow docs/ledger-format.md (B1-B8); ` +
    "the same bundle checked with `truss ledger verify --bundle` gives the same result.";
  document.getElementById("verify-keys").addEventListener("click", () => run(current.bytes, keyField.value, current.derived));
  document.getElementById("verify-pasted").addEventListener("click", () => {
    current = { bytes: utf8(document.getElementById("bundle-text").value), derived: null };
    run(current.bytes, keyField.value, null);
  });
  document.getElementById("bundle-file").addEventListener("change", (event) => {
    const file = event.target.files && event.target.files[0];
    if (!file) return;
    current = { bytes: file.arrayBuffer().then((buffer) => new Uint8Array(buffer)), derived: null };
    run(current.bytes, keyField.value, null);
  });
  run(current.bytes, keyField.value, current.derived);
})();
