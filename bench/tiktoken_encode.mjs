// Encodes a text file with OpenAI's tiktoken (npm `tiktoken`: its Rust core compiled to WASM),
// GPT-2's vocabulary ("gpt2" encoding), and prints one JSON line: tokens, and the wall and CPU
// seconds of the encode call alone (loading the encoder and reading the file are not timed).
//
//   node bench/tiktoken_encode.mjs NODE_MODULES TEXT
import fs from 'fs';
import path from 'path';
import {createRequire} from 'module';

const [nodeModules, textPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(nodeModules), 'x.js'));
const {get_encoding} = require('tiktoken');
const enc = get_encoding('gpt2');
const text = fs.readFileSync(textPath, 'utf8');
const cpu0 = process.cpuUsage();
const t0 = process.hrtime.bigint();
const ids = enc.encode_ordinary(text);
const wall = Number(process.hrtime.bigint() - t0) / 1e9;
const cpu = process.cpuUsage(cpu0);
console.log(JSON.stringify({impl: 'tiktoken', bytes: Buffer.byteLength(text), tokens: ids.length, wall_s: wall,
                            cpu_s: (cpu.user + cpu.system) / 1e6}));
enc.free();
