#!/usr/bin/env bash
# The coordinator speaks the worker protocol and links no engine and no kernels (issue 13): its
# binary defines none of their symbols. The worker binary is the control: the same pattern must
# find the engine there, so the check cannot pass by matching nothing.
set -euo pipefail
coordinator="$1"
worker="$2"
pattern='specd::(LlamaEngine|WorkerRuntime|KvPool|RowSampler|RowPool|kernels::)'
engine_in_worker=$(nm -C --defined-only "$worker" | grep -cE "$pattern" || true)
if ((engine_in_worker == 0)); then
  echo "control failed: no engine symbols found in $worker with /$pattern/" >&2
  exit 1
fi
if nm -C --defined-only "$coordinator" | grep -E "$pattern" | head -5 | grep -q .; then
  echo "$coordinator defines engine symbols:" >&2
  nm -C --defined-only "$coordinator" | grep -E "$pattern" | head -20 >&2
  exit 1
fi
scheduler=$(nm -C --defined-only "$coordinator" | grep -c 'specd::Scheduler::' || true)
if ((scheduler == 0)); then
  echo "control failed: $coordinator defines no specd::Scheduler symbols" >&2
  exit 1
fi
echo "ok: $engine_in_worker engine symbols in the worker, none in the coordinator"
