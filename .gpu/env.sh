# Sourced at the start of every command on a lent GPU machine (no network there): installs the wheels
# carried in .whl/ (torchao; see ../shared/GPU.md) into /tmp/site and sets the environment the suite runs in.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "env.sh: installing .whl/ failed (carry .whl)"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# the copy that travels has no git metadata of its own: the commit comes in .gpu/commit (ignored, carried),
# written here before the call by `git rev-parse HEAD > .gpu/commit`
[ -s .gpu/commit ] && export MXVAL_COMMIT=$(cat .gpu/commit)
# NVLink multicast stays off on the two-GPU machines (../shared/GPU.md), also for processes started from here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 - <<'PY' > "${OUT:-/tmp}/env.json"
import json, platform, torch, torchao
print(json.dumps({"python": platform.python_version(), "torch": torch.__version__, "torchao": torchao.__version__,
                  "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}))
PY
cat "${OUT:-/tmp}/env.json"
