#!/usr/bin/env python3
"""Helper for bench/compare.sh (standard library only).

  record  parse one benchmark run (its stdout, exit status, /usr/bin/time RSS file) and print one
          JSON record line for the raw log; a one-line summary goes to stderr
  report  read the raw log, take per-setting medians across rounds, print markdown tables and
          write the results file (date, machine, versions, commands, tables)
  eta     estimate the seconds left from the raw log and the list of runs still to do
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys

# Targets: row name -> (minimum tapelm/PyTorch speed ratio, informative only?)
SPEED_TARGETS = {
    "train-baby": (2.0, False),
    "train-mid-kv8": (1.5, False),
    "train-mid-kv2": (1.5, False),
    "train-mid-kv1": (1.5, False),
    "train-nano": (1.5, False),
    "decode-mid-kv8-b1": (3.0, False),
    "decode-mid-kv8-b32": (1.5, False),
    "decode-mid-kv2-b1": (3.0, True),
    "decode-mid-kv2-b32": (1.5, True),
    "decode-mid-kv1-b1": (3.0, True),
    "decode-mid-kv1-b32": (1.5, True),
}
MFU_ROW, MFU_TARGET = "train-nano", 0.50
CPU_MFU_TARGET = 0.70          # nano training against the CPU's theoretical peak (AVX-512)
CPU_MFU_TARGET_AVX2 = 0.60     # the same on an AVX2 CPU (two FMA pipes x 8 lanes)
NO_ENV_TARGET = 0.90           # tapelm with no environment variable ÷ with the best core forced
SCALING_ROW, SCALING_TARGET = "train-mid-kv8", 1.7
BF16_STEP_TARGET = 1.4         # a -bf16 row's step against its f32 row (tapelm, bf16 instructions)
BF16_LINEAR_TARGET = 1.8       # the same for the linear layers' products alone (bench's linear_s)

def setting_label(s):
    """t2 -> '2 threads', t2p -> '2 threads, OMP_WAIT_POLICY=passive'."""
    m = re.fullmatch(r"t(\d+)(p?)(f?)", s)
    if not m:
        return s
    n = int(m.group(1))
    lab = f"{n} thread" + ("s" if n != 1 else "")
    return lab + (", passive" if m.group(2) else "") + (", best core forced" if m.group(3) else "")


def last_json_line(text):
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return None


def read_rss_kb(path):
    """GNU time -f %M -o FILE: the last integer line (a 'Command exited...' line may precede it)."""
    try:
        with open(path) as f:
            lines = [l.strip() for l in f if l.strip()]
    except OSError:
        return None
    for l in reversed(lines):
        if l.isdigit():
            return int(l)
    return None


# ----------------------------------------------------------------------------------------- record
def cmd_record(a):
    with open(a.stdout, errors="replace") as f:
        out = f.read()
    err = ""
    if a.stderr and os.path.exists(a.stderr):
        with open(a.stderr, errors="replace") as f:
            err = f.read()
    js = last_json_line(out)
    rec = {"row": a.row, "who": a.who, "setting": a.setting, "round": a.round,
           "rc": a.rc, "wall_s": round(a.secs, 3), "rss_kb": read_rss_kb(a.rss_file),
           "cmd": a.cmd, "ok": False}
    if js is not None and a.rc == 0:
        tps = js.get("tokens_per_s", js.get("tok_per_s_median"))
        if tps is not None:
            rec["ok"] = True
            rec["tok_s"] = float(tps)
    if js is not None:
        rec["json"] = js
    if not rec["ok"]:
        tail = (err.strip().splitlines() or out.strip().splitlines() or ["(no output)"])[-3:]
        rec["error"] = " | ".join(tail)[-400:]
    print(json.dumps(rec), flush=True)
    rss = f"{rec['rss_kb'] / 1024:.0f} MiB" if rec["rss_kb"] else "RSS ?"
    if rec["ok"]:
        extra = ""
        if js.get("model_flops_per_s") and js.get("sgemm_peak_flops_per_s"):
            extra = f", MFU {100 * js['model_flops_per_s'] / js['sgemm_peak_flops_per_s']:.1f}%"
        print(f"    -> {rec['tok_s']:.1f} tok/s, {rss}{extra}, {a.secs:.1f} s wall", file=sys.stderr)
    else:
        print(f"    -> FAILED (exit {a.rc}): {rec['error']}", file=sys.stderr)


# -------------------------------------------------------------------------------------------- eta
def cmd_eta(a):
    """stdin: one 'row who setting' line per run still to do.  Estimate each from the median wall time
    of the same run in earlier rounds, else of the same row, else of everything so far."""
    by_key, by_row, allv = {}, {}, []
    for r in load_raw(a.raw):
        by_key.setdefault((r["row"], r["who"], r["setting"]), []).append(r["wall_s"])
        by_row.setdefault(r["row"], []).append(r["wall_s"])
        allv.append(r["wall_s"])
    total, guessed = 0.0, False
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3:
            continue
        if tuple(parts) in by_key:
            total += statistics.median(by_key[tuple(parts)])
        elif parts[0] in by_row:
            total += statistics.median(by_row[parts[0]])
            guessed = True
        elif allv:
            total += statistics.median(allv)
            guessed = True
        else:
            print("?")
            return
    m, s = divmod(int(round(total)), 60)
    h, m = divmod(m, 60)
    print(("~" if guessed else "") + (f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"))


# ----------------------------------------------------------------------------------------- report
def load_raw(path):
    recs = []
    if not os.path.exists(path):
        return recs
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return recs


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_info():
    info = {}
    lscpu = sh(["lscpu"])
    fields = {}
    for line in lscpu.splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            fields.setdefault(k.strip(), v.strip())
    info["model"] = fields.get("Model name", platform.processor() or "?")
    try:
        cores = int(fields.get("Core(s) per socket", "0")) * int(fields.get("Socket(s)", "0"))
    except ValueError:
        cores = 0
    info["cores"] = cores or None
    info["cpus"] = fields.get("CPU(s)")
    info["threads_per_core"] = fields.get("Thread(s) per core")
    info["hypervisor"] = fields.get("Hypervisor vendor")
    info["nproc"] = sh(["nproc"])
    info["kernel"] = platform.release()
    flags = fields.get("Flags", "").split()
    info["simd"] = " ".join(f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags)
    info["cpu_class"] = os.environ.get("CPU_CLASS") or cpu_class(flags)  # compare.sh exports its own
    return info


def cpu_class(flags):
    """The class whose results file a run belongs to: avx512, avx2 (with FMA) or other."""
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags and "fma" in flags:
        return "avx2"
    return "other"


def fmt_tok(x):
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def fmt_mib(kb):
    return "—" if kb is None else f"{kb / 1024:.0f} MiB"


def met(ok):
    return "—" if ok is None else ("met" if ok else "**missed**")


class Data:
    def __init__(self, recs):
        self.recs = recs
        self.rows = []            # row names in first-seen order
        self.by = {}              # (row, who, setting) -> [records]
        for r in recs:
            if r["row"] not in self.rows:
                self.rows.append(r["row"])
            self.by.setdefault((r["row"], r["who"], r["setting"]), []).append(r)

    def settings(self, row, who):
        seen = []
        for (rw, w, s) in self.by:
            if rw == row and w == who and s not in seen:
                seen.append(s)
        return seen

    def ok(self, row, who, setting):
        return [r for r in self.by.get((row, who, setting), []) if r.get("ok")]

    def median(self, row, who, setting):
        v = [r["tok_s"] for r in self.ok(row, who, setting)]
        return statistics.median(v) if v else None

    def rss(self, row, who, setting):
        v = [r["rss_kb"] for r in self.ok(row, who, setting) if r.get("rss_kb")]
        return max(v) if v else None

    def best(self, row, who, only=None):
        """(setting, median) with the highest median tok/s among the settings (or only those)."""
        cands = [(s, self.median(row, who, s)) for s in self.settings(row, who)
                 if only is None or s in only]
        cands = [c for c in cands if c[1] is not None]
        return max(cands, key=lambda c: c[1]) if cands else (None, None)

    def failures(self):
        return [r for r in self.recs if not r.get("ok")]

    def first_json(self, who, key):
        for r in self.recs:
            if r["who"] == who and r.get("json") and key in r["json"]:
                return r["json"][key]
        return None


def build_tables(d, tapelm_best_from):
    lines = []
    summary = []   # (what, met?) for required targets

    # speed table
    lines.append("### Speed: tapelm vs PyTorch (tokens/s, median over rounds)\n")
    lines.append("| row | tapelm tok/s (setting) | PyTorch best tok/s (setting) | ratio | target | met? |")
    lines.append("|---|---:|---:|---:|---|---|")
    for row in d.rows:
        tgt, info = SPEED_TARGETS.get(row, (None, True))
        ts, tv = d.best(row, "tapelm", tapelm_best_from)
        ps, pv = d.best(row, "torch")
        ratio = tv / pv if (tv and pv) else None
        ok = None if (ratio is None or tgt is None) else ratio >= tgt
        tgt_txt = "—" if tgt is None else f"≥ {tgt:.1f}×" + (" (informative)" if info else "")
        lines.append(f"| {row} | {fmt_tok(tv)} ({setting_label(ts) if ts else 'failed'}) | "
                     f"{fmt_tok(pv)} ({setting_label(ps) if ps else 'failed'}) | "
                     f"{'—' if ratio is None else f'{ratio:.2f}×'} | {tgt_txt} | {met(ok)} |")
        if tgt is not None and not info:
            summary.append((f"{row} speed", ok))

    # RSS table (training rows)
    train_rows = [r for r in d.rows if r.startswith("train-")]
    if train_rows:
        peer_settings = []
        for row in train_rows:
            for s in d.settings(row, "torch"):
                if s not in peer_settings:
                    peer_settings.append(s)
        lines.append("")
        lines.append("### Peak RSS of the training runs (`/usr/bin/time -f %M`, max over rounds)\n")
        lines.append("tapelm at the setting of its speed figure; PyTorch compared at the setting of *its* "
                     "speed figure (its fastest of the three); all PyTorch settings shown.\n")
        hdr = "| row | tapelm | " + " | ".join(f"PyTorch {setting_label(s)}" for s in peer_settings) + \
              " | tapelm ÷ PyTorch (its best setting) | target | met? |"
        lines.append(hdr)
        lines.append("|---|---:|" + "---:|" * len(peer_settings) + "---:|---|---|")
        for row in train_rows:
            ts, _ = d.best(row, "tapelm", tapelm_best_from)
            ps, _ = d.best(row, "torch")
            trss = d.rss(row, "tapelm", ts) if ts else None
            prss = d.rss(row, "torch", ps) if ps else None
            r = trss / prss if (trss and prss) else None
            ok = None if r is None else trss <= prss
            cells = " | ".join(fmt_mib(d.rss(row, "torch", s)) for s in peer_settings)
            lines.append(f"| {row} | {fmt_mib(trss)} | {cells} | {'—' if r is None else f'{r:.2f}'} | "
                         f"≤ PyTorch | {met(ok)} |")
            summary.append((f"{row} RSS", ok))

    # MFU and scaling
    extra = []
    if MFU_ROW in d.rows:
        ts, _ = d.best(MFU_ROW, "tapelm", tapelm_best_from)
        recs = [r for r in (d.ok(MFU_ROW, "tapelm", ts) if ts else []) if r.get("json", {}).get("model_flops_per_s")]
        for key, what, target, name in (
                ("sgemm_peak_flops_per_s", "sgemm peak (measured in the same run)", MFU_TARGET, "nano MFU (sgemm)"),
                ("cpu_peak_flops_per_s", "CPU theoretical peak (cores × FMA × lanes × 2 × measured clock)",
                 CPU_MFU_TARGET, "nano MFU (CPU)")):
            rs = [r for r in recs if r["json"].get(key)]
            mfu = statistics.median([r["json"]["model_flops_per_s"] / r["json"][key] for r in rs]) if rs else None
            ok = None if mfu is None else mfu >= target
            detail = "—"
            if mfu is not None:
                mf = statistics.median([r["json"]["model_flops_per_s"] for r in rs])
                pk = statistics.median([r["json"][key] for r in rs])
                detail = f"{mf / 1e9:.1f} GFLOP/s of {pk / 1e9:.1f} GFLOP/s ({setting_label(ts)})"
            extra.append(f"| nano training: model FLOP/s ÷ {what} | {detail} | "
                         f"{'—' if mfu is None else f'{100 * mfu:.1f} %'} | ≥ {100 * target:.0f} % | {met(ok)} |")
            summary.append((name, ok))
    for row in [r for r in d.rows if r.startswith("train-")]:
        forced = [s for s in d.settings(row, "tapelm") if s.endswith("f")]
        for fs in forced:
            plain = fs[:-1]
            a, b = d.median(row, "tapelm", plain), d.median(row, "tapelm", fs)
            if a is None or b is None:
                continue
            ok = a / b >= NO_ENV_TARGET
            extra.append(f"| {row}: no environment variable ÷ best OpenBLAS core forced | "
                         f"{fmt_tok(a)} vs {fmt_tok(b)} tok/s ({setting_label(plain)}) | {a / b:.2f} | "
                         f"≥ {NO_ENV_TARGET:.2f} | {met(ok)} |")
            summary.append((f"{row} without environment", ok))
    if SCALING_ROW in d.rows:
        t1 = d.median(SCALING_ROW, "tapelm", "t1")
        t2s = [s for s in d.settings(SCALING_ROW, "tapelm") if re.fullmatch(r"t2p?", s)]
        s2, t2 = d.best(SCALING_ROW, "tapelm", t2s) if t2s else (None, None)
        sp = t2 / t1 if (t1 and t2) else None
        ok = None if sp is None else sp >= SCALING_TARGET
        detail = (f"{fmt_tok(t2)} tok/s ({setting_label(s2)}) vs {fmt_tok(t1)} tok/s (1 thread)"
                  if sp is not None else "—")
        extra.append(f"| mid KV 8 training: tapelm 2 threads ÷ 1 thread | {detail} | "
                     f"{'—' if sp is None else f'{sp:.2f}×'} | ≥ {SCALING_TARGET:.1f}× | {met(ok)} |")
        summary.append(("mid 2-thread speed-up", ok))
    lines.extend(bf16_table(d, tapelm_best_from, summary))
    if extra:
        lines.append("")
        lines.append("### Efficiency and scaling (tapelm)\n")
        lines.append("| row | figures | value | target | met? |")
        lines.append("|---|---|---:|---|---|")
        lines.extend(extra)

    # all settings, per round
    lines.append("")
    lines.append("### Every setting (tokens/s per round → median; peak RSS)\n")
    lines.append("| row | program | setting | per round | median | RSS |")
    lines.append("|---|---|---|---|---:|---:|")
    for row in d.rows:
        for who in ("tapelm", "torch"):
            for s in d.settings(row, who):
                rs = d.by[(row, who, s)]
                per = ", ".join(fmt_tok(r["tok_s"]) if r.get("ok") else "fail" for r in rs)
                lines.append(f"| {row} | {'tapelm' if who == 'tapelm' else 'PyTorch'} | {setting_label(s)} | "
                             f"{per} | {fmt_tok(d.median(row, who, s))} | {fmt_mib(d.rss(row, who, s))} |")

    # same model on both sides? (parameter counts from the two programs' JSON)
    mism = []
    for row in d.rows:
        pt = {r["json"].get("params") for r in d.recs if r["row"] == row and r["who"] == "tapelm" and r.get("json")}
        pp = {r["json"].get("params") for r in d.recs if r["row"] == row and r["who"] == "torch" and r.get("json")}
        pt.discard(None)
        pp.discard(None)
        if pt and pp and pt != pp:
            mism.append(f"{row}: tapelm {sorted(pt)} vs PyTorch {sorted(pp)}")
    if mism:
        lines.append("")
        lines.append("**Warning: parameter counts differ** (not the same model?): " + "; ".join(mism))

    n_met = sum(1 for _, ok in summary if ok)
    n_known = sum(1 for _, ok in summary if ok is not None)
    head = f"**Targets met: {n_met} of {len(summary)}**"
    if n_known < len(summary):
        head += f" ({len(summary) - n_known} without a figure)"
    missed = [w for w, ok in summary if ok is False]
    if missed:
        head += "; missed: " + ", ".join(missed)
    return head, lines


def median_json(d, row, who, setting, key):
    v = [r["json"][key] for r in d.ok(row, who, setting) if r.get("json", {}).get(key) is not None]
    return statistics.median(v) if v else None


def bf16_table(d, tapelm_best_from, summary):
    """Each -bf16 row beside its f32 row: tapelm's step and linear-product speed-ups (the targets,
    on a CPU with bf16 instructions), the rest of the step, and PyTorch autocast's speed-up."""
    pairs = [(r[:-len("-bf16")], r) for r in d.rows if r.endswith("-bf16") and r[:-len("-bf16")] in d.rows]
    if not pairs:
        return []
    lines = ["", "### bf16 mixed precision against f32 (median over rounds, each program at its best setting)\n",
             "tapelm `--precision bf16` (the linear layers' products in bf16 with f32 sums, everything else f32) "
             "against tapelm f32; PyTorch: bench.py's step with its forward under "
             "`torch.autocast(\"cpu\", dtype=torch.bfloat16)` (bench/autocast_bench.py) against bench.py. "
             "Linear products: tapelm's `linear_s`, the wall time per step inside the linear layers' "
             "kernels (forward and backward: the GEMMs, bias, bf16 rounding of the output gradient); "
             "rest = step − linear products.\n",
             "| row | tapelm f32 step ms (linear, rest) | tapelm bf16 step ms (linear, rest) | step speed-up | "
             "linear speed-up | PyTorch f32 → autocast tok/s | PyTorch speed-up | tapelm bf16 ÷ PyTorch autocast |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]

    def split(row, setting):
        if setting is None:
            return None, None
        step, lin = median_json(d, row, "tapelm", setting, "median_s"), median_json(d, row, "tapelm", setting, "linear_s")
        return step, lin

    def cell(step, lin):
        if step is None:
            return "—"
        if lin is None:
            return f"{1e3 * step:.1f}"
        return f"{1e3 * step:.1f} ({1e3 * lin:.1f}, {1e3 * (step - lin):.1f})"

    for f32_row, bf_row in pairs:
        ts32, tv32 = d.best(f32_row, "tapelm", tapelm_best_from)
        tsbf, tvbf = d.best(bf_row, "tapelm", tapelm_best_from)
        _, pv32 = d.best(f32_row, "torch")
        _, pvbf = d.best(bf_row, "torch")
        s32, l32 = split(f32_row, ts32)
        sbf, lbf = split(bf_row, tsbf)
        step_up = tvbf / tv32 if (tvbf and tv32) else None
        lin_up = l32 / lbf if (l32 and lbf) else None
        torch_up = pvbf / pv32 if (pvbf and pv32) else None
        vs_torch = tvbf / pvbf if (tvbf and pvbf) else None

        def ratio(x, target=None):
            if x is None:
                return "—"
            return f"{x:.2f}×" + ("" if target is None else f" (≥ {target:.1f}×: {met(x >= target)})")
        lines.append(f"| {bf_row} | {cell(s32, l32)} | {cell(sbf, lbf) if tsbf else 'not run (see notes)'} | "
                     f"{ratio(step_up, BF16_STEP_TARGET)} | {ratio(lin_up, BF16_LINEAR_TARGET)} | "
                     f"{fmt_tok(pv32)} → {fmt_tok(pvbf)} | {ratio(torch_up)} | {ratio(vs_torch)} |")
        if step_up is not None:
            summary.append((f"{bf_row} step speed-up", step_up >= BF16_STEP_TARGET))
        if lin_up is not None:
            summary.append((f"{bf_row} linear-product speed-up", lin_up >= BF16_LINEAR_TARGET))
    return lines


def hold_peak_to_8_lanes(d):
    """An AVX2 class measures against the 8-lane peak. tapelm states the lanes its peak counts
    (cpu_peak_lanes) since it holds the peak to the GEMMs' vector width; a record without that key
    counted the CPU's own (16 on an AVX-512 CPU standing in for AVX2): rescale it to 8."""
    for r in d.recs:
        j = r.get("json") or {}
        pk, hz, t = j.get("cpu_peak_flops_per_s"), j.get("cpu_clock_hz"), j.get("threads")
        if r["who"] != "tapelm" or not pk or not hz or not t or "cpu_peak_lanes" in j:
            continue
        lanes = round(pk / (hz * t * 2 * 2))  # cores x 2 FMA units x lanes x 2 x clock
        if lanes > 8:
            j["cpu_peak_flops_per_s"] = pk * 8 / lanes
            j["cpu_peak_lanes"] = 8


def cmd_report(a):
    d = Data(load_raw(a.raw))
    meta = json.loads(a.meta) if a.meta else {}
    tapelm_best_from = a.tapelm_best_from.split(",") if a.tapelm_best_from else None
    if not d.recs:
        print("no runs recorded", file=sys.stderr)
        return 1
    mi = machine_info()
    global CPU_MFU_TARGET
    if mi.get("cpu_class", "").startswith("avx2"):
        CPU_MFU_TARGET = CPU_MFU_TARGET_AVX2
        hold_peak_to_8_lanes(d)
    head, tables = build_tables(d, tapelm_best_from)

    torch_v = d.first_json("torch", "torch")
    py_v = d.first_json("torch", "python")
    ob_core = d.first_json("torch", "openblas_core")
    ob_cfg = d.first_json("torch", "openblas_config")

    out = []
    out.append("# tapelm vs PyTorch: benchmark results\n")
    if meta.get("partial"):
        out.append(f"> **Partial results** ({meta['partial']}); the run did not finish.\n")
    if meta.get("quick"):
        out.append("> **Smoke test (`--quick`: 1 round, 2 iterations)** — the figures are not a measurement.\n")
    out.append(f"- date: {meta.get('date') or datetime.datetime.now().astimezone().isoformat(timespec='seconds')}")
    cores = f"{mi['cores']} cores" if mi.get("cores") else "cores ?"
    out.append(f"- machine: {mi['model']}, {cores}, {mi.get('cpus')} CPUs "
               f"({mi.get('threads_per_core')} thread(s) per core), `nproc` = {mi.get('nproc')}"
               + (f", {mi['hypervisor']} guest" if mi.get("hypervisor") else "")
               + f", Linux {mi['kernel']}" + (f", SIMD: {mi['simd']}" if mi.get("simd") else ""))
    out.append(f"- CPU class: **{mi['cpu_class']}** (each class keeps its own results file: bench/RESULTS.<class>.md)")
    if meta.get("tapelm_rev"):
        out.append(f"- tapelm: `{meta.get('tapelm_bin', 'build/tapelm')}` from commit {meta['tapelm_rev']}"
                   + (f", OpenBLAS core {meta['tapelm_blas_core']}" if meta.get("tapelm_blas_core") else "")
                   + (f" ({meta['tapelm_blas_lib']})" if meta.get("tapelm_blas_lib") else ""))
    peaks = {}
    for r in d.recs:
        j = r.get("json") or {}
        if r["who"] == "tapelm" and j.get("sgemm_peak_flops_per_s"):
            peaks.setdefault(j.get("threads", "?"), []).append(j["sgemm_peak_flops_per_s"])
    if peaks:
        out.append("- tapelm's measured sgemm peak (median over its training runs): " + ", ".join(
            f"{statistics.median(v) / 1e9:.1f} GFLOP/s at {t} thread{'s' if t != 1 else ''}"
            for t, v in sorted(peaks.items(), key=lambda kv: str(kv[0]))))
    cpeaks = {}
    for r in d.recs:
        j = r.get("json") or {}
        if r["who"] == "tapelm" and j.get("cpu_peak_flops_per_s"):
            cpeaks.setdefault(j.get("threads", "?"), []).append((j["cpu_peak_flops_per_s"], j.get("cpu_clock_hz", 0)))
    if cpeaks:
        out.append("- the CPU's theoretical peak (cores × FMA units × lanes × 2 × measured clock, median): " + ", ".join(
            f"{statistics.median([p for p, _ in v]) / 1e9:.1f} GFLOP/s at {t} thread{'s' if t != 1 else ''} "
            f"({statistics.median([c for _, c in v]) / 1e9:.2f} GHz)"
            for t, v in sorted(cpeaks.items(), key=lambda kv: str(kv[0]))))
    gemm = d.first_json("tapelm", "gemm")
    if gemm:
        out.append(f"- tapelm's GEMM backend: {gemm}")
    if meta.get("forced_core"):
        out.append(f"- OpenBLAS core forced for PyTorch and for tapelm's `f` settings: "
                   f"`OPENBLAS_CORETYPE={meta['forced_core']}` (the best this CPU runs, as `tapelm inspect --system` reports)")
    out.append(f"- PyTorch: torch {torch_v or '?'} on Python {py_v or '?'}, OpenBLAS core {ob_core or '?'}"
               + (f" ({ob_cfg})" if ob_cfg else ""))
    if meta.get("rounds") is not None:
        out.append(f"- rounds: {meta['rounds']}; iterations per run: {meta.get('iters_desc', '?')}; "
                   f"warm-up: {meta.get('warmup_desc', '?')}")
    for n in meta.get("notes", []):
        out.append(f"- note: {n}")
    out.append("")
    nt = meta.get("threads", "N")
    out.append("Method: every row is run round by round, the programs alternating within each round "
               f"(tapelm at each of its settings, then PyTorch at 1 thread, at {nt} threads, and at {nt} "
               "threads with `OMP_WAIT_POLICY=passive`), each run under `/usr/bin/time -f %M` for its peak RSS. A run's figure is its own median over its timed iterations "
               "(tapelm `tokens_per_s`, PyTorch `tok_per_s_median`); the table shows the median of those "
               "over rounds. PyTorch is held at the best of its settings (docs/formats.md §5); tapelm at "
               + (meta.get("tapelm_best_desc") or "its best setting") + ". "
               "`OMP_NUM_THREADS`, `OPENBLAS_NUM_THREADS` and `OMP_WAIT_POLICY` are cleared for every run "
               "(the programs set their own thread counts) and `OMP_WAIT_POLICY=passive` is set only "
               "for the passive settings. Decode: 1-token prompt to T = block_size tokens, "
               "tokens/s = batch·(T−1)/median.\n")
    out.append(head + "\n")
    out.extend(tables)
    fails = d.failures()
    if fails:
        out.append("")
        out.append("### Failed runs\n")
        for r in fails:
            out.append(f"- {r['row']} {r['who']} {r['setting']} round {r['round']}: exit {r['rc']}: "
                       f"{r.get('error', '')}")
    out.append("")
    out.append("### Commands (round 1 of each setting; run from the repository root)\n")
    out.append("```")
    seen = set()
    for r in d.recs:
        key = (r["row"], r["who"], r["setting"])
        if key in seen:
            continue
        seen.add(key)
        out.append(r["cmd"])
    out.append("```")
    if meta.get("invocation"):
        out.append("")
        out.append(f"Produced by `{meta['invocation']}`.")
    text = "\n".join(out) + "\n"

    # stdout: the summary and the tables only
    print()
    print(head)
    print()
    print("\n".join(tables))
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        print(f"\nwrote {a.out_display or a.out}", file=sys.stderr)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="sub", required=True)
    r = sub.add_parser("record")
    r.add_argument("--row", required=True)
    r.add_argument("--who", required=True, choices=("tapelm", "torch"))
    r.add_argument("--setting", required=True)
    r.add_argument("--round", type=int, required=True)
    r.add_argument("--rc", type=int, required=True)
    r.add_argument("--secs", type=float, required=True)
    r.add_argument("--stdout", required=True)
    r.add_argument("--stderr")
    r.add_argument("--rss-file", required=True)
    r.add_argument("--cmd", required=True)
    e = sub.add_parser("eta")
    e.add_argument("--raw", required=True)
    p = sub.add_parser("report")
    p.add_argument("--raw", required=True)
    p.add_argument("--out")
    p.add_argument("--out-display")
    p.add_argument("--meta", help="JSON object: date, rounds, notes, ...")
    p.add_argument("--tapelm-best-from", help="comma list of tapelm settings eligible for its speed figure")
    a = ap.parse_args()
    if a.sub == "record":
        cmd_record(a)
    elif a.sub == "eta":
        cmd_eta(a)
    else:
        sys.exit(cmd_report(a))


if __name__ == "__main__":
    main()
