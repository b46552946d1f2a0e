set -o pipefail
mkdir -p /tmp/site && tar xJf .dep/site.tar.xz -C /tmp/site || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind SHAPEBENCH_SPEEDS=/tmp/speeds.json SHAPEBENCH_CACHE=/tmp/sbcache
S=search_spaces/quickstart.yaml; D="--data embedded:wiki,bible"
python3 -c "from benchmark.data import prepare; from benchmark.data.config import DataConfig; prepare(DataConfig(source='embedded:wiki,bible'))" || exit 4
for i in 1 2; do
  timeout 40 python3 run_search.py $S --plan 2>&1 | tail -2
  /usr/bin/time -f "run$i %e s" timeout 150 python3 run_search.py $S $D --name qs-gpu-$i 2>&1 | tail -4
done
timeout 40 python3 run_search.py $S --plan 2>&1 | tail -2
python3 -c "import json;print(json.load(open('/tmp/speeds.json'))['machines'])" | head -c 3000
tar czf $OUT/r.tgz results/qs-gpu-*/_study.json results/qs-gpu-*/trials
