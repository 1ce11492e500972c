# Sourced at the start of every command on a GPU machine without network access: installs the wheels carried in
# .whl/ (torchao; README.md says how to download it) into /tmp/site and sets the environment the suite runs in.
# Run from the repository root.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "env.sh: installing .whl/ failed (carry .whl)"; exit 2; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# a working tree copied to the machine has no git metadata: the commit comes in dev/gpu/commit (ignored, carried),
# written before the call by `git rev-parse HEAD > dev/gpu/commit`
[ -s dev/gpu/commit ] && export MXVAL_COMMIT=$(cat dev/gpu/commit)
# NVLink multicast stays off on the two-GPU machines, also for processes started from here
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# what this machine is, as every result records it (numerics.environment.describe: versions, GPUs, driver, host
# CPU, commit); golden.tier_summary takes this file as --environment-from
python3 -c 'import json; from numerics.environment import describe; print(json.dumps({"environment": describe()}))' \
    > "${OUT:-/tmp}/env.json"
cat "${OUT:-/tmp}/env.json"
