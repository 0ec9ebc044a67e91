# vgpu-patch's node program (POSIX sh): functions only; the caller sets the variables below, then calls them.
# The CLI's probe, the node agent and the Ansible role all send this same file, so each rule here has one home.
# shellcheck shell=sh

# -- variables (every one the functions read or set; the caller overrides the first group) ----------------
D=${D:-/usr/local/vgpu}        # the library directory (HAMi's host path), as a real path on this machine
PROC=${PROC:-/proc}            # where the processes are (a test may point it at a fake tree)
LIB=libvgpu.so                 # the unversioned name
CONTAINER_LIB=/usr/local/vgpu/libvgpu.so  # where HAMi mounts the chosen file inside a container
LIVE=""                        # choose_live: the live file's path ("" on a refusal)
WHY=""                         # choose_live: the evidence that decided it, or why it refused
CANDS=""                       # choose_live: the version-like names (they never hold a space)

# -- the live file (docs/node-state.md "The live file") ---------------------------------------------------
# is_version SUFFIX: true for a HAMi plugin version (v2.6.0, 2.6.0, v2.6.0-rc1: digits and dots, then
# -word parts); false for every leftover (.bak, .orig, .old, .new, .backup-*, .patched, ~, .dpkg-*, .rpmsave,
# .swp, our temp names, anything else). Pure shell: no process per name.
is_version() {
  _v=${1#v}; _n=${_v%%-*}; _r=${_v#"$_n"}
  case $_n in ''|.*|*.|*..*|*[!0-9.]*) return 1;; esac
  while [ -n "$_r" ]; do
    _r=${_r#-}; _w=${_r%%-*}; _r=${_r#"$_w"}
    case $_w in
      ''|*[!0-9A-Za-z]*|[Bb][Aa][Kk]|[Oo][Rr][Ii][Gg]|[Oo][Ll][Dd]|[Nn][Ee][Ww]|[Bb][Aa][Cc][Kk][Uu][Pp]*) return 1;;
      [Pp][Aa][Tt][Cc][Hh][Ee][Dd]|[Ss][Aa][Vv][Ee]|[Ss][Ww][Pp]|[Tt][Mm][Pp]|[Oo][Rr][Ii][Gg][Ii][Nn][Aa][Ll]) return 1;;
    esac
  done
}

# preload_names: the words of $D/ld.so.preload (never read through a symlink), one per line
preload_names() {
  [ -f "$D/ld.so.preload" ] && [ ! -L "$D/ld.so.preload" ] || return 0
  grep -v '^[[:space:]]*#' "$D/ld.so.preload" | tr -s ': \t' '\n' | grep -v '^$'
}

# pick_one NAMES...: sets _pick when exactly one of $CANDS is among NAMES (basenames); false otherwise
pick_one() {
  _pick=""; _k=0
  for _c in $CANDS; do
    for _w in "$@"; do
      if [ "${_w##*/}" = "$_c" ]; then _pick=$_c; _k=$((_k + 1)); break; fi
    done
  done
  [ "$_k" -eq 1 ]
}

# by_plugin: the running device plugin carries /k8s-vgpu/lib/nvidia/libvgpu.so.<its VERSION> in its image,
# and mounts the host file of that name: readable as root through /proc/PID/root
by_plugin() {
  _seen=""; _pid=""
  for _p in "$PROC"/[0-9]*/root/k8s-vgpu/lib/nvidia/"$LIB".*; do
    [ -e "$_p" ] || continue
    _b=${_p##*/}
    case " $_seen " in *" $_b "*) ;; *) _seen="$_seen $_b"; _pid=${_p#"$PROC"/}; _pid=${_pid%%/*};; esac
  done
  # shellcheck disable=SC2086  # the names hold no space
  pick_one $_seen || return 1
  WHY="the running device plugin (pid $_pid) carries $_pick"
}

# by_preload: ld.so.preload names one of them outright
by_preload() {
  # shellcheck disable=SC2046  # one name a line, none with a space (is_version)
  pick_one $(preload_names) || return 1
  WHY="ld.so.preload names $_pick"
}

# by_maps: running processes (containers map the file under its container path) map exactly one of them
by_maps() {
  _hit=$(grep -s -h -F -e "$D/$LIB" -e "$CONTAINER_LIB" "$PROC"/[0-9]*/maps | while read -r _a _b _c _d _i _rest; do
    echo "$_i"; done | sort -u)
  _names=""
  for _c in $CANDS; do
    _i=$(stat -L -c %i "$D/$_c" 2>/dev/null) || continue
    case "$_NL$_hit$_NL" in *"$_NL$_i$_NL"*) _names="$_names $_c";; esac
  done
  # shellcheck disable=SC2086  # the names hold no space
  pick_one $_names || return 1
  WHY="running processes map $_pick (inode $(stat -L -c %i "$D/$_pick"))"
}
_NL='
'

# choose_live: the file HAMi's plugin mounts: libvgpu.so.<its version> when present, else libvgpu.so.
# Sets LIVE and WHY (the evidence); returns 1 with WHY saying why it refuses. Only version-like names can
# be live; two or more are decided by the running plugin, then ld.so.preload, then /proc/*/maps.
choose_live() {
  LIVE=""; WHY=""; CANDS=""; _k=0
  for _f in "$D/$LIB".*; do
    [ -e "$_f" ] || [ -L "$_f" ] || continue
    _b=${_f##*/}
    if is_version "${_b#"$LIB".}"; then CANDS="$CANDS $_b"; _k=$((_k + 1)); fi
  done
  CANDS=${CANDS# }
  if [ "$_k" -eq 0 ]; then
    LIVE="$D/$LIB"; WHY="no versioned file: the plugin mounts $LIB"
  elif [ "$_k" -eq 1 ]; then
    LIVE="$D/$CANDS"; WHY="the only versioned file: the plugin mounts $LIB.<its version>"
  elif by_plugin || by_preload || by_maps; then
    LIVE="$D/$_pick"; WHY="$_k versioned files ($CANDS): $WHY"
  else
    _l=""; for _c in $CANDS; do _l="${_l:+$_l, }$_c"; done
    WHY="several versioned libraries ($_l) and nothing shows which one the plugin uses (no running"
    WHY="$WHY plugin carries one, ld.so.preload names none, running processes map none or several): remove the"
    WHY="$WHY stale ones, then rerun"
    return 1
  fi
  for _w in $(preload_names); do  # HAMi's own line names $CONTAINER_LIB; another library name is a conflict
    _b=${_w##*/}
    case $_b in libvgpu*)
      [ "$_b" = "$LIB" ] || [ "$_b" = "${LIVE##*/}" ] || {
        WHY="ld.so.preload names $_w but the live file is ${LIVE##*/}; fix ld.so.preload (or the plugin), then rerun"
        LIVE=""; return 1; };;
    esac
  done
}

# print_live: choose_live's verdict for the controller: `ok<TAB>NAME<TAB>WHY` or `refuse<TAB>WHY`
print_live() {
  if choose_live; then printf 'ok\t%s\t%s\n' "${LIVE##*/}" "$WHY"; else printf 'refuse\t%s\n' "$WHY"; fi
}
