// Compares `tapelm prepare --tokenizer-model TOKENIZER_JSON` with the oracle ids oracle.mjs wrote
// (Hugging Face's Rust tokenizers), text by text.
//
//   node bench/real_tokenizers/compare.mjs NODE_MODULES TAPELM ORACLE_JSON [TOKENIZER_JSON] > REPORT.json
//
// NODE_MODULES holds npm's `tokenizers` (used only to show the tokens around a difference);
// TAPELM is a built tapelm binary; TOKENIZER_JSON defaults to the oracle's "file" (relative to
// the current directory). Every text is a document of its own: the short strings and the small
// files go through one prepare run as separate --text files and are told apart by the BOS id that
// starts each document (a text whose own content holds the BOS token's text gets a run of its
// own); each file above 64 KiB gets its own run. prepare's leading BOS (EOS for tokenizers with
// none, Qwen2) is dropped before comparing. Long files are encoded by prepare in 1 MiB pieces,
// so a difference near a piece's end may be prepare's cut rather than the tokenizer.
// --val-fraction 0 keeps every document in train. Prints one JSON object; a summary line per
// text goes to standard error.
import {execFileSync} from 'child_process';
import fs from 'fs';
import os from 'os';
import path from 'path';
import {createRequire} from 'module';

const [nodeModules, tapelm, oraclePath, tokArg] = process.argv.slice(2);
if (!oraclePath) {
  console.error('usage: node compare.mjs NODE_MODULES TAPELM ORACLE_JSON [TOKENIZER_JSON]');
  process.exit(2);
}
const oracle = JSON.parse(fs.readFileSync(oraclePath, 'utf8'));
const tokPath = path.resolve(tokArg || oracle.file);
const require = createRequire(path.join(path.resolve(nodeModules), 'x.js'));
const {Tokenizer} = require('tokenizers');
const hf = Tokenizer.fromFile(tokPath);
const work = fs.mkdtempSync(path.join(os.tmpdir(), 'tapelm-compare-'));

function readCorpus(dir) {
  const meta = JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8'));
  const ids = [];
  for (const split of ['train', 'val'])
    for (const s of meta[split].shards) {
      const b = fs.readFileSync(path.join(dir, s.file));
      const n = b.readInt32LE(8), wide = b.readInt32LE(0) === 20240801;
      for (let i = 0; i < n; i++) ids.push(wide ? b.readUInt32LE(1024 + 4 * i) : b.readUInt16LE(1024 + 2 * i));
    }
  return {meta, ids};
}

let runs = 0;
function prepare(texts) {  // texts: [{name, file}] -> {ok, message, meta, ids}
  const out = path.join(work, `out${runs++}`);
  const args = ['prepare', '--out', out, '--tokenizer-model', tokPath, '--val-fraction', '0', '--quiet', '--text', ...texts.map((t) => t.file)];
  try {
    execFileSync(tapelm, args, {stdio: ['ignore', 'pipe', 'pipe'], maxBuffer: 1 << 26});
  } catch (e) {
    const msg = (e.stderr || '').toString().trim().split('\n').pop();
    return {ok: false, message: msg};
  }
  const r = readCorpus(out);
  fs.rmSync(out, {recursive: true, force: true});
  return {ok: true, ...r};
}

// Myers' O(ND) diff of two id arrays: the hunks [a0, a1) of a against [b0, b1) of b.
function diff(a, b) {
  let s = 0;
  while (s < a.length && s < b.length && a[s] === b[s]) s++;
  let ea = a.length, eb = b.length;
  while (ea > s && eb > s && a[ea - 1] === b[eb - 1]) ea--, eb--;
  const A = a.slice(s, ea), B = b.slice(s, eb), N = A.length, M = B.length, MAX = N + M;
  if (MAX === 0) return [];
  const off = MAX + 1, v = new Int32Array(2 * MAX + 3), trace = [];
  let found = false;
  for (let d = 0; d <= MAX && !found; d++) {
    trace.push(v.slice(off - d - 1, off + d + 2));
    for (let k = -d; k <= d; k += 2) {
      let x = k === -d || (k !== d && v[off + k - 1] < v[off + k + 1]) ? v[off + k + 1] : v[off + k - 1] + 1;
      let y = x - k;
      while (x < N && y < M && A[x] === B[y]) x++, y++;
      v[off + k] = x;
      if (x >= N && y >= M) { found = true; break; }
    }
    if (d > 3000) return [{a0: s, a1: ea, b0: s, b1: eb, note: 'too many differences for the diff'}];
  }
  // Backtrack to the list of matched pairs.
  const matches = [];
  let x = N, y = M;
  for (let d = trace.length - 1; d > 0; d--) {
    const vv = trace[d], get = (k) => vv[k + d + 1];
    const k = x - y;
    const prevK = k === -d || (k !== d && get(k - 1) < get(k + 1)) ? k + 1 : k - 1;
    const px = get(prevK), py = px - prevK;
    while (x > px && y > py && x > 0 && y > 0 && (x - 1) - (y - 1) === k) { x--, y--; matches.push([x, y]); }
    x = px, y = py;
  }
  while (x > 0 && y > 0) { x--, y--; matches.push([x, y]); }
  matches.reverse();
  const hunks = [];
  let ia = 0, ib = 0;
  for (const [mx, my] of [...matches, [N, M]]) {
    if (mx > ia || my > ib) hunks.push({a0: s + ia, a1: s + mx, b0: s + ib, b1: s + my});
    ia = mx + 1, ib = my + 1;
  }
  return hunks;
}

const tokens = (ids) => ids.map((i) => hf.idToToken(i));
async function describe(oracleIds, mine, h) {
  const c0 = Math.max(0, h.a0 - 4), c1 = Math.min(oracleIds.length, h.a1 + 4);
  return {
    oracle_at: h.a0, tapelm_at: h.b0, ...(h.note ? {note: h.note} : {}),
    oracle_ids: oracleIds.slice(h.a0, h.a1), tapelm_ids: mine.slice(h.b0, h.b1),
    oracle_tokens: tokens(oracleIds.slice(h.a0, h.a1)), tapelm_tokens: tokens(mine.slice(h.b0, h.b1)),
    text: await hf.decode(oracleIds.slice(h.a0, h.a1), false),
    context: await hf.decode(oracleIds.slice(c0, c1), false),
  };
}

// Write the texts and plan the runs.
const entries = oracle.texts.map((t, i) => {
  const file = path.join(work, `text${String(i).padStart(3, '0')}.txt`);
  if (t.text !== undefined) fs.writeFileSync(file, t.text);
  else fs.copyFileSync(t.source, file);
  return {...t, file, bytes: fs.statSync(file).size};
});
const probe = prepare([{file: entries.find((e) => e.kind === 'short').file}]);
const report = {tokenizer: tokPath, oracle: oraclePath, library: oracle.library};
if (!probe.ok) {
  report.accepted = false;
  report.message = probe.message;
  console.error(`refused: ${probe.message}`);
  console.log(JSON.stringify(report, null, 1));
  process.exit(0);
}
report.accepted = true;
const lead = probe.meta.tokenizer.bos_id >= 0 ? probe.meta.tokenizer.bos_id : probe.meta.tokenizer.eos_id;
const leadText = hf.idToToken(lead);
report.lead_id = lead;
const results = new Map();
const batch = entries.filter((e) => e.bytes <= 65536 && !(e.text || '').includes(leadText));
const alone = entries.filter((e) => !batch.includes(e));
const r = prepare(batch);
const docs = [];
for (const id of r.ids) if (id === lead) docs.push([]); else docs[docs.length - 1].push(id);
if (docs.length === batch.length) batch.forEach((e, i) => results.set(e.name, docs[i]));
else alone.push(...batch);
for (const e of alone) {
  const q = prepare([e]);
  if (!q.ok) throw new Error(`prepare failed on ${e.name}: ${q.message}`);
  if (q.ids[0] !== lead) throw new Error(`${e.name}: prepare's first id ${q.ids[0]} is not ${lead}`);
  results.set(e.name, q.ids.slice(1));
}

report.texts = [];
let allEqual = 0, allIds = 0;
for (const e of entries) {
  const mine = results.get(e.name);
  const hunks = diff(e.ids, mine);
  const differing = hunks.reduce((n, h) => n + (h.a1 - h.a0), 0);
  const entry = {name: e.name, kind: e.kind, bytes: e.bytes, oracle_ids: e.ids.length, tapelm_ids: mine.length,
                 equal: e.ids.length - differing, differing_oracle_ids: differing,
                 differing_tapelm_ids: hunks.reduce((n, h) => n + (h.b1 - h.b0), 0), hunks: hunks.length,
                 first: await Promise.all(hunks.slice(0, 5).map((h) => describe(e.ids, mine, h)))};
  if (e.kind === 'short' || hunks.length) entry.text = e.text;
  report.texts.push(entry);
  allEqual += entry.equal, allIds += e.ids.length;
  console.error(`${e.name}: ${hunks.length ? 'DIFF' : 'equal'} oracle ${e.ids.length} tapelm ${mine.length} equal ${entry.equal} hunks ${hunks.length}`);
}
report.summary = {texts: entries.length, texts_equal: report.texts.filter((t) => t.hunks === 0).length, oracle_ids: allIds, equal_ids: allEqual};
fs.rmSync(work, {recursive: true, force: true});
console.log(JSON.stringify(report, null, 1));
