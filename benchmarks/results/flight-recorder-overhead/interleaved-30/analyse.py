"""On/off ratios of the flight recorder from alternated bench_overhead runs (median of per-pair ratios, bootstrap CI)."""
import glob, re, random, statistics, sys
d = sys.argv[1]
names = ["pccl_torch.all_reduce", "pccl_torch.all_gather_into_tensor", "pccl_torch.reduce_scatter_tensor", "raw mpi4py Allreduce"]
def read(path):
    out = {}
    for line in open(path):
        m = re.match(r"\s+(.+?)\s{2,}([0-9.]+)$", line)
        if m: out[m.group(1).strip()] = float(m.group(2))
    return out
runs = sorted({int(re.search(r"-(\d+)\.txt$", p).group(1)) for p in glob.glob(f"{d}/r2-0-*.txt")})
random.seed(1)
for name in names:
    ratios = [read(f"{d}/r2-2000-{k}.txt")[name] / read(f"{d}/r2-0-{k}.txt")[name] for k in runs]
    med = statistics.median(ratios)
    boot = sorted(statistics.median(random.choices(ratios, k=len(ratios))) for _ in range(2000))
    on = statistics.median(read(f"{d}/r2-2000-{k}.txt")[name] for k in runs); off = statistics.median(read(f"{d}/r2-0-{k}.txt")[name] for k in runs)
    print(f"{name:38s} off {off:5.2f} us  on {on:5.2f} us  on/off median of {len(runs)} pairs {med:.3f}  (95% CI {boot[50]:.3f}-{boot[1949]:.3f})")
