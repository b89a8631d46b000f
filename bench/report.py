#!/usr/bin/python3
"""Assembles bench/run_all.sh's raw results (one JSON file per run in a directory) into one table on stdout and
one results file (bench/results/<date>.json).

  /usr/bin/python3 bench/report.py RAW_DIR OUT.json --meta META.json

Raw files, by name:
  ampdist_<prec>_np<N>.json   ampdist_bench_train on the main job     torch_<prec>_np<N>_<wait>.json  torch_mlp.py
  big_<prec>_np<N>.json       ampdist_bench_train on the 100M model    allreduce_np<N>.json  ampdist_bench_allreduce
  kernels.json                ampdist_bench_kernels (Google Benchmark JSON)
Targets (docs/performance.md): fp32 >= 1.5x PyTorch fp32, bf16 >= 1.0x PyTorch bf16 autocast, Reducer >= 0.9x raw
MPI_Allreduce busbw at >= 1 MiB, mixed-precision machinery <= 5% of the step on the 100M model.
"""
import argparse
import glob
import json
import os
import re
import statistics


def load(path):
    with open(path) as f:
        return json.load(f)


def fmt(x, nd=0):
    return "-" if x is None else f"{x:,.{nd}f}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("out")
    ap.add_argument("--meta", required=True)
    a = ap.parse_args()
    meta = load(a.meta)
    files = {os.path.basename(p)[:-5]: load(p) for p in glob.glob(os.path.join(a.raw, "*.json"))}
    res = {"meta": meta, "throughput": [], "allreduce": [], "mp_overhead": [], "scaling": [], "memory": [],
           "kernels": [], "models": [], "targets": {}}
    out = []
    p = out.append

    # ---- 1. main job throughput
    p("1. Main job (configs/fashion_mnist_mlp.pbtxt: MLP 784-512-256-10, global batch 128, SGD Nesterov),")
    p("   training samples/s after warm-up, median of windows; PyTorch = better of OMP_WAIT_POLICY default/passive")
    p(f"{'ranks':>5} {'threads':>7} {'prec':>5} | {'ampdist':>9} | {'PyTorch':>9} | {'ratio':>6} | "
      f"{'GEMM limit':>10} | {'of limit':>8}")
    for key in sorted(k for k in files if k.startswith("ampdist_")):
        m = re.match(r"ampdist_(\w+)_np(\d+)$", key)
        prec, np_ = m.group(1), int(m.group(2))
        r = files[key]
        torch_runs = [files[k] for k in files if re.match(rf"torch_{prec}_np{np_}_\w+$", k)]
        t = max((x["samples_per_s_median"] for x in torch_runs), default=None)
        row = {"precision": prec, "world_size": np_, "threads_per_rank": r["threads_per_rank"],
               "oversubscribed": np_ * r["threads_per_rank"] > meta["nproc"],
               "ampdist_samples_per_s": r["samples_per_s_median"], "ampdist_windows": r["samples_per_s"],
               "torch_samples_per_s": t,
               "torch_runs": {k: files[k]["samples_per_s_median"] for k in files
                              if re.match(rf"torch_{prec}_np{np_}_\w+$", k)},
               "ratio": ratio(r["samples_per_s_median"], t),
               "gemm_bound_samples_per_s": r["gemm_bound_samples_per_s"],
               "of_gemm_bound": ratio(r["samples_per_s_median"], r["gemm_bound_samples_per_s"]),
               "sgemm_flop_s": r["sgemm_flop_s"], "gemm_flops_per_sample": r["gemm_flops_per_sample"]}
        res["throughput"].append(row)
        label = f"{np_}{'*' if row['oversubscribed'] else ''}"
        p(f"{label:>5} {r['threads_per_rank']:>7} {prec:>5} | {fmt(row['ampdist_samples_per_s']):>9} | "
          f"{fmt(t):>9} | {fmt(row['ratio'], 2):>6} | {fmt(row['gemm_bound_samples_per_s']):>10} | "
          f"{fmt(row['of_gemm_bound'], 2):>8}")
    p("   * oversubscribed: more ranks x threads than cores. PyTorch CPU autocast has no fp16: no PyTorch fp16 row.")

    # ---- 2. all-reduce
    p("")
    p("2. Gradient all-reduce: Reducer (25 MiB buckets, 4 MiB parameters) vs one raw MPI_Allreduce, FP32, "
      "busbw GB/s (median)")
    p(f"{'ranks':>5} {'bytes':>11} | {'Reducer':>8} | {'MPI':>8} | {'ratio':>6}")
    for key in sorted((k for k in files if k.startswith("allreduce_np")), key=lambda k: int(k[12:])):
        r = files[key]
        n = r["world_size"]
        for row in r["rows"]:
            row = dict(row, world_size=n, oversubscribed=n > meta["nproc"])
            res["allreduce"].append(row)
            p(f"{str(n) + ('*' if row['oversubscribed'] else ''):>5} {row['bytes']:>11} | "
              f"{row['reducer_busbw_gb_s']:>8.3f} | {row['mpi_busbw_gb_s']:>8.3f} | {row['ratio_busbw']:>6.2f}")

    # ---- 3. mixed-precision machinery
    p("")
    p("3. Mixed-precision machinery per step (cast + unscale/check + consensus + scaler), median ms and share of step")
    p(f"{'model':>10} {'ranks':>5} {'prec':>5} | {'step ms':>8} | {'cast':>7} | {'unscale':>7} | {'consens':>7} | "
      f"{'scaler':>7} | {'share':>6}")
    for key in sorted(k for k in files if k.startswith(("ampdist_", "big_", "model_"))):
        r = files[key]
        model = "main job" if key.startswith("ampdist_") else "100M" if "mlp100m" in key or key.startswith("big_") \
            else key.split("_")[1]
        mp = r["mp"]
        row = {"model": model, "params": r["params"], "global_batch": r["global_batch"], "precision": r["precision"],
               "world_size": r["world_size"], "step_s": r["step_s_median"], **mp}
        res["mp_overhead"].append(row)
        p(f"{model:>10} {r['world_size']:>5} {r['precision']:>5} | {r['step_s_median'] * 1e3:>8.2f} | "
          f"{mp['cast_to_working_s'] * 1e3:>7.3f} | {mp['unscale_and_check_s'] * 1e3:>7.3f} | "
          f"{mp['consensus_s'] * 1e3:>7.3f} | {mp['scaler_update_s'] * 1e3:>7.4f} | {mp['share_of_step'] * 100:>5.1f}%")

    # ---- 4. scaling
    p("")
    p("4. Scaling 1 -> N ranks at the same global batch on the same cores (efficiency = samples/s N / samples/s 1)")
    p(f"{'prec':>5} {'ranks':>5} | {'samples/s':>9} | {'efficiency':>10}")
    by = {(x["precision"], x["world_size"]): x for x in res["throughput"]}
    for (prec, n), x in sorted(by.items()):
        base = by.get((prec, 1))
        if not base or n == 1:
            continue
        eff = ratio(x["ampdist_samples_per_s"], base["ampdist_samples_per_s"])
        res["scaling"].append({"precision": prec, "world_size": n, "oversubscribed": x["oversubscribed"],
                               "efficiency": eff})
        p(f"{prec:>5} {str(n) + ('*' if x['oversubscribed'] else ''):>5} | {fmt(x['ampdist_samples_per_s']):>9} | "
          f"{fmt(eff, 2):>10}")

    # ---- 5. memory
    p("")
    p("5. Peak RSS per rank (max over ranks) vs expected model-state + activation bytes, MiB")
    p(f"{'model':>10} {'ranks':>5} {'prec':>5} | {'peak':>8} | {'at start':>8} | {'expected':>8} | "
      f"{'master':>7} {'working':>7} {'grads':>7} {'optim':>7} {'activ':>7}")
    mib = 1 / (1 << 20)
    for key in sorted(k for k in files if k.startswith(("ampdist_", "big_", "model_"))):
        r = files[key]
        m = r["memory"]
        model = "main job" if key.startswith("ampdist_") else "100M" if "mlp100m" in key or key.startswith("big_") \
            else key.split("_")[1]
        res["memory"].append({"model": model, "precision": r["precision"], "world_size": r["world_size"], **m})
        p(f"{model:>10} {r['world_size']:>5} {r['precision']:>5} | {m['peak_rss_bytes_max_over_ranks'] * mib:>8.1f} | "
          f"{m['rss_start_bytes'] * mib:>8.1f} | {m['expected_bytes'] * mib:>8.1f} | {m['master_bytes'] * mib:>7.1f} "
          f"{m['working_bytes'] * mib:>7.1f} {m['grads_bytes'] * mib:>7.1f} {m['optimizer_bytes'] * mib:>7.1f} "
          f"{m['activations_bytes'] * mib:>7.1f}")

    # ---- models against PyTorch
    p("")
    p("7. Models against PyTorch (samples/s, median of windows; limit = model GEMM FLOPs at oneDNN's measured")
    p("   matmul rate in the working dtype; peak = RSS per rank, max over ranks; load = 1-min load average)")
    p(f"{'model':>9} {'ranks':>5} {'thr':>3} {'prec':>5} | {'ampdist':>9} | {'PyTorch':>9} | {'ratio':>5} | "
      f"{'vs fp32':>7} | {'limit':>9} | {'of lim':>6} | {'peak MiB':>8} | {'vs fp32':>7} | {'load':>5} | engine")
    loads = meta.get("loads", {})
    models = {}
    for key in sorted(k for k in files if k.startswith("model_")):
        m = re.match(r"model_(\w+?)_(fp32|fp16|bf16)_np(\d+)$", key)
        if not m:
            continue
        name, prec, np_ = m.group(1), m.group(2), int(m.group(3))
        r = files[key]
        tk = f"torchmodel_{name}_{prec}_np{np_}"
        t = files[tk]["samples_per_s_median"] if tk in files else None
        models[(name, np_, prec)] = {
            "model": name, "world_size": np_, "threads_per_rank": r["threads_per_rank"], "precision": prec,
            "ampdist_samples_per_s": r["samples_per_s_median"], "ampdist_windows": r["samples_per_s"],
            "torch_samples_per_s": t, "torch_windows": files[tk]["samples_per_s"] if tk in files else None,
            "torch_version": files[tk]["torch_version"] if tk in files else None,
            "ratio_vs_torch": ratio(r["samples_per_s_median"], t),
            "gemm_bound_samples_per_s": r["gemm_bound_samples_per_s"], "matmul_flop_s": r["sgemm_flop_s"],
            "of_gemm_bound": ratio(r["samples_per_s_median"], r["gemm_bound_samples_per_s"]),
            "peak_rss_bytes": r["memory"]["peak_rss_bytes_max_over_ranks"],
            "torch_peak_rss_bytes": files[tk].get("peak_rss_bytes") if tk in files else None,
            "engine": r.get("engine", {}), "load": loads.get(key)}
    for (name, np_, prec), x in sorted(models.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "fp32")):
        base = models.get((name, np_, "fp32"))
        x["ratio_vs_ampdist_fp32"] = ratio(x["ampdist_samples_per_s"], base["ampdist_samples_per_s"]) if base else None
        x["peak_vs_fp32"] = ratio(x["peak_rss_bytes"], base["peak_rss_bytes"]) if base else None
        res["models"].append(x)
        p(f"{name:>9} {np_:>5} {x['threads_per_rank']:>3} {prec:>5} | {fmt(x['ampdist_samples_per_s'], 1):>9} | "
          f"{fmt(x['torch_samples_per_s'], 1):>9} | {fmt(x['ratio_vs_torch'], 2):>5} | "
          f"{fmt(x['ratio_vs_ampdist_fp32'], 2):>7} | {fmt(x['gemm_bound_samples_per_s'], 1):>9} | "
          f"{fmt(x['of_gemm_bound'], 2):>6} | {x['peak_rss_bytes'] / (1 << 20):>8.0f} | {fmt(x['peak_vs_fp32'], 2):>7} | "
          f"{(x['load'] or '-').split(' ')[0]:>5} | {x['engine'].get('gemm_impl', '-')}")

    # ---- kernels
    if "kernels" in files:
        p("")
        p("6. Kernels (Google Benchmark, 1 thread): rate and share of the machine's measured limit")
        bench = files["kernels"]["benchmarks"]
        # Each kernel against the limit measured at the same size (the last /N of the name): sgemm of the same n
        # for GEMMs (the best sgemm for other shapes), memcpy of the same element count for the passes, so that
        # in-cache sizes meet in-cache limits and DRAM sizes DRAM limits.
        sgemm, memcpy = {}, {}
        for b in bench:
            size = b["name"].rsplit("/", 1)[-1]
            if b["name"].startswith("BM_Sgemm/"):
                sgemm[size] = b.get("FLOP/s", 0)
            if b["name"].startswith("BM_MemoryCopy/"):
                memcpy[size] = b.get("bytes_per_second", 0)
        for b in bench:
            if b.get("run_type") == "aggregate":
                continue
            size = b["name"].rsplit("/", 1)[-1]
            if "FLOP/s" in b:
                v, lim, unit = b["FLOP/s"], sgemm.get(size, max(sgemm.values(), default=None)), "GFLOP/s"
            elif "bytes_per_second" in b:
                v, lim, unit = b["bytes_per_second"], memcpy.get(size), "GB/s"
            else:
                continue
            share = ratio(v, lim)
            res["kernels"].append({"name": b["name"], "rate": v, "unit": unit, "of_limit": share})
            p(f"   {b['name']:<36} {v / 1e9:>8.2f} {unit:<8} {fmt(share, 2):>5} of "
              f"{'sgemm' if unit == 'GFLOP/s' else 'memcpy'} of that size")

    # ---- targets
    t = {}
    tp = {(x["precision"], x["world_size"]): x for x in res["throughput"]}
    for prec, goal in (("fp32", 1.5),):
        for n in (1, 2):
            x = tp.get((prec, n))
            if x and x["ratio"] is not None:
                t[f"{prec}_vs_torch_np{n}"] = {"ratio": x["ratio"], "target": goal, "met": x["ratio"] >= goal}
    big = [x for x in res["allreduce"] if x["bytes"] >= (1 << 20) and not x["oversubscribed"]]
    if big:
        worst = min(x["ratio_busbw"] for x in big)
        med = statistics.median(x["ratio_busbw"] for x in big)
        t["reducer_vs_mpi_busbw_ge_1MiB"] = {"min_ratio": worst, "median_ratio": med, "target": 0.9,
                                             "met": worst >= 0.9}
    bigmp = [x for x in res["mp_overhead"] if x["model"] == "100M"]
    if bigmp:
        worst = max(x["share_of_step"] for x in bigmp)
        t["mp_share_100M"] = {"max_share": worst, "target": 0.05, "met": worst <= 0.05}
    mt = {(x["model"], x["world_size"], x["precision"]): x for x in res["models"]}
    for n in (1, 2):
        for key, field_, goal, model, prec in (
                ("mlp100m_bf16_vs_fp32", "ratio_vs_ampdist_fp32", 2.0, "mlp100m", "bf16"),
                ("mlp100m_bf16_vs_torch", "ratio_vs_torch", 1.2, "mlp100m", "bf16"),
                ("gpt2s_bf16_vs_fp32", "ratio_vs_ampdist_fp32", 1.5, "gpt2s", "bf16"),
                ("gpt2s_fp32_vs_torch", "ratio_vs_torch", 1.0, "gpt2s", "fp32"),
                ("gpt2s_bf16_vs_torch", "ratio_vs_torch", 1.0, "gpt2s", "bf16"),
                ("fortunes_fp32_vs_torch", "ratio_vs_torch", 1.0, "fortunes", "fp32")):
            x = mt.get((model, n, prec))
            if x and x.get(field_) is not None:
                t[f"{key}_np{n}"] = {"ratio": x[field_], "target": goal, "met": x[field_] >= goal}
        x = mt.get(("gpt2s", n, "bf16"))
        if x and x.get("peak_vs_fp32") is not None:
            t[f"gpt2s_bf16_peak_vs_fp32_np{n}"] = {"ratio": x["peak_vs_fp32"], "target": 0.75,
                                                   "met": x["peak_vs_fp32"] <= 0.75}
    res["targets"] = t
    p("")
    p("Targets:")
    for k, v in t.items():
        p(f"   {k:<32} {'met' if v['met'] else 'NOT met'}  " +
          ", ".join(f"{kk} {vv:.3f}" for kk, vv in v.items() if isinstance(vv, float)))
    p("")
    p("Machine: " + meta.get("cpu", "?") + f" ({meta.get('cpu_flags', '?')}), nproc {meta['nproc']}; load average {meta.get('loadavg_start')} at "
      f"start, {meta.get('loadavg_end')} at end")
    text = "\n".join(out)
    print(text)
    res["table"] = text
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
