# vgpu-patch's node program (POSIX sh). Every tool sends this same file: the CLI (at the head of its probe,
# then the swap's calls on the same stdin), the node agent (the CLI's code over a local transport) and the
# Ansible role (files/node.sh is this file). So each rule here has one home. It only defines variables and
# functions; the caller then sets the parameters and calls the steps, in this order (docs/node-state.md):
#   probe | begin, safe_state, lock, receive or stage, verify_source, load_test, back_up, swap_in, reverify,
#   [byte_compare], record, report (with a verified signature, keep_signature before swap_in).
#   The Ansible role: role_main deploy|rollback.   Status: print_live.   A rollback's target: print_backup.
# shellcheck shell=sh

# -- exit codes (the controller parses these lines: vgpu_patch/deploy/script.py) ---------------------------
E_MISMATCH=65   # the file to go live does not have the wanted sha256 (a corrupted upload)
E_NOLOAD=66     # LD_PRELOAD of the new file makes /bin/true fail
E_AMBIGUOUS=67  # which file is live is unclear (choose_live refused), or the live name is a symlink
E_VERIFY=68     # after the rename the live file is not what was wanted
E_WRITE=71      # a write failed (disk full, permissions, no such directory)
E_LOCKED=75     # another deploy or rollback holds the lock
E_UNSAFE=77     # the state directory holds symlinks or (as root) entries not root's alone

# -- variables: parameters (set by the caller after this file) -------------------------------------------
D=/usr/local/vgpu   # the library directory (HAMi's host path), as a real path on this machine
PROC=/proc          # where the processes are (a test points it at a fake tree)
HISTORY=20          # probe: history lines to print
MAPS=1              # probe: print the processes mapping the library (1) or not
LIVE=""             # the live file's real path (choose_live sets it; the CLI passes its own choice back)
WANT=""             # the sha256 the live file must have at the end
UP=""               # an upload to copy in (SFTP path), removed once copied
SRC=""              # a file on the node to copy in (rollback: the backup)
UPDIR=""            # where uploads land: their orphans (older than 5 minutes) are swept
LIVEJ=null          # the live path as recorded (JSON)
ACTJ='"deploy"'     # the history action (JSON)
OPJ='""'            # the operator (JSON)
TOOLJ='"vgpu-patch"'  # the tool (JSON)
STALE=0             # report: also print the processes still mapping the library
SIG=""              # a signature of WANT the controller verified (the .sig's text): keep_signature stores it
SIGNERJ=""          # its signer (JSON: {"principal", "key"}), recorded in the history; empty: unsigned
PROBED_ME=""        # the uid the probe printed (the swap reuses it in the same shell)
TO=""               # rollback: previous | vendor | 6+ hex digits of a backup's sha256 (choose_backup); probe: the
                    # same, to print the rollback's verdict (empty: none)
# -- variables: set by the steps ---------------------------------------------------------------------------
LIB=libvgpu.so                            # the unversioned name
CONTAINER_LIB=/usr/local/vgpu/libvgpu.so  # where HAMi mounts the chosen file inside a container
S=""; ME=""; NOW=""; NOWJ=""               # the state dir, our uid, the swap's clock (plain and JSON)
TMP=""; BTMP=""; LT=""; LOCKDIR=""         # temp files and the mkdir lock (removed by cleanup)
WHY=""; CANDS=""                           # choose_live: the evidence (or the refusal), the version-like names
BACKUP=""; STACK=""; RECORDED=""           # choose_backup: the sha256 to restore; the rollback stack (" a b c");
                                           # every from_sha256 the history records
cur=""; got=""; HASH=""                    # the sha256 of what is live, of what goes live, hash_of's result
BK=""; NEWBK=""; REC=""; FROMJ=null; CURJ=null; SIZE=0  # back_up: the backup, and what the history records
WANTJ=null                                 # the wanted sha256 (JSON), set by begin
NEWSIG=""                                  # keep_signature wrote a signature (made durable with the file)
UNSAFE=""                                  # probe: the state dir is not to be read through
NL='
'
TAB='	'
# Scratch names, each used inside one function only: bad m out rc PRE keep sums code n f h p v o j l, and the
# choose_live and choose_backup helpers' _-prefixed ones.

# -- helpers -------------------------------------------------------------------------------------------------
rmx() {  # rm -f what of "$@" exists: no rm process at all on the common path
  n=$#
  while [ "$n" -gt 0 ]; do
    if [ -e "$1" ] || [ -L "$1" ]; then set -- "$@" "$1"; fi
    shift; n=$((n - 1))
  done
  [ $# -eq 0 ] || rm -f -- "$@"
}
cleanup() {  # only what this run created
  rmx ${TMP:+"$TMP"} ${BTMP:+"$BTMP"} ${UP:+"$UP"}
  [ -n "$LOCKDIR" ] && rmdir "$LOCKDIR"
  [ -n "$LT" ] && rm -rf "$LT"
}
fail() { code=$1; shift; printf '@@err %s\n' "$*"; exit "$code"; }
hash_of() { HASH=$(sha256sum < "$1") || return 1; HASH=${HASH%% *}; }  # into $HASH: one subshell, not two
json_str() { _j=$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'); printf '"%s"' "$_j"; }

# whole_lib FILE SIZE: a whole 64-bit ELF: magic, and its section headers (at the end) inside the file; a cp
# caught mid-copy (HAMi's plugin rewrites the live file in place) is not
whole_lib() {
  [ "$2" -gt 64 ] || return 1
  command -v od >/dev/null 2>&1 || return 0  # no od: a non-empty file counts as whole
  # shellcheck disable=SC2046  # od's 64 byte values are meant to split: byte k is ${k+2}
  set -- "$2" $(od -An -v -N64 -tu1 "$1" 2>/dev/null)
  [ $# -eq 65 ] && [ "$2.$3.$4.$5" = 127.69.76.70 ] || return 1
  if [ "$7" = 2 ]; then  # EI_DATA: big-endian
    o=$(( (${42} << 56) + (${43} << 48) + (${44} << 40) + (${45} << 32) + (${46} << 24) + (${47} << 16) \
      + (${48} << 8) + ${49} ))
    o=$(( o + ((${60} << 8) + ${61}) * ((${62} << 8) + ${63}) ))
  else
    o=$(( (${49} << 56) + (${48} << 48) + (${47} << 40) + (${46} << 32) + (${45} << 24) + (${44} << 16) \
      + (${43} << 8) + ${42} ))
    o=$(( o + ((${61} << 8) + ${60}) * ((${63} << 8) + ${62}) ))
  fi
  [ "$o" -le "$1" ]  # e_shoff + e_shentsize * e_shnum: the section headers end inside the file
}

# maps: every process mapping the library (its host path, or HAMi's in-container path): one grep
maps() {
  grep -s -H -F -e "$D/$LIB" -e "$CONTAINER_LIB" "$PROC"/[0-9]*/maps | sort -u || true
}

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
    case "$NL$_hit$NL" in *"$NL$_i$NL"*) _names="$_names $_c";; esac
  done
  # shellcheck disable=SC2086  # the names hold no space
  pick_one $_names || return 1
  WHY="running processes map $_pick (inode $(stat -L -c %i "$D/$_pick"))"
}

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

# -- the rollback's target (docs/node-state.md "Rollback") --------------------------------------------------
# whole_backup SHA: backups/SHA.so is a whole library (whole_lib: over an ELF header's 64 bytes, its section
# headers inside it): older versions kept empty files, or files caught mid-copy, and a rollback never restores one
whole_backup() {
  [ -f "$S/backups/$1.so" ] || return 1
  _sz=$(stat -c %s "$S/backups/$1.so" 2>/dev/null) || return 1
  whole_lib "$S/backups/$1.so" "$_sz"
}

# kept SHA: a backup anyone can pick: its manifest beside it (a file without one is not listed by status)
kept() { [ -f "$S/backups/$1.json" ] && whole_backup "$1"; }

# hist_field LINE KEY: _v = the 64-hex string value of "KEY" in a history line, or empty (null, absent, other)
hist_field() {
  case $1 in
    *"\"$2\": \""*) _v=${1#*"\"$2\": \""};;
    *"\"$2\":\""*) _v=${1#*"\"$2\":\""};;
    *) _v=""; return 0;;
  esac
  _v=${_v%%\"*}
  case $_v in *[!0-9a-f]*) _v="";; esac
  [ ${#_v} -eq 64 ] || _v=""
}

# stack_line LINE: one history line onto STACK: each swap pushes what it replaced, each rollback to a file on
# the stack pops back to below it (deploy v1, v2; rollback, rollback = v1, vendor). A line cut short is skipped.
stack_line() {
  case $1 in *"}") ;; *"}"[[:space:]]) ;; *) return 0;; esac
  hist_field "$1" to_sha256; _to=$_v
  [ -n "$_to" ] || return 0
  hist_field "$1" from_sha256; _fr=$_v
  case $_fr in ?*) RECORDED="$RECORDED $_fr";; esac
  case $1 in *'"action": "rollback"'*|*'"action":"rollback"'*)
    case "$STACK " in *" $_to "*) STACK=${STACK%" $_to"*}; return 0;; esac;;
  esac
  if [ -n "$_fr" ] && [ "$_fr" != "$_to" ] && [ "${STACK##* }" != "$_fr" ]; then STACK="$STACK $_fr"; fi
}

# rollback_stack: STACK from the history, with a swap killed before its record (pending.json, when its file
# is live: its to_sha256 is $cur) counted as the last line unless already there (as settle does on disk)
rollback_stack() {
  STACK=""; RECORDED=""; _last=""
  if [ -f "$S/history.jsonl" ]; then
    while IFS= read -r _l || [ -n "$_l" ]; do stack_line "$_l"; _last=$_l; done < "$S/history.jsonl"
  fi
  if [ -n "$cur" ] && [ -f "$S/pending.json" ]; then
    _p=""; IFS= read -r _p < "$S/pending.json" || true
    hist_field "$_p" to_sha256
    if [ "$_v" = "$cur" ] && [ "$_p" != "$_last" ]; then stack_line "$_p"; fi
  fi
}

# choose_backup: the backup a rollback restores, for the live file of sha256 $cur (empty: none): TO=previous
# (the rollback stack's top: the file before the last swap still in effect), vendor (its bottom: the file before
# the first recorded swap) or a backup's sha256 (6+ hex digits, one whole backup). With no record of a swap that
# replaced a kept file, previous and vendor take the newest other whole backup. Sets BACKUP and WHY; returns 1
# with WHY saying why it refuses. Only whole backups (whole_backup) are ever chosen.
choose_backup() {
  BACKUP=""; WHY=""
  case ${TO:-previous} in
    previous|vendor) ;;
    *)
      case $TO in *[!0-9a-fA-F]*) _bad=1;; *) _bad="";; esac
      if [ -n "$_bad" ] || [ ${#TO} -lt 6 ] || [ ${#TO} -gt 64 ]; then
        WHY="--to $TO: give previous, vendor, or at least 6 hex digits of a backup's sha256"; return 1
      fi
      _want=$(printf '%s' "$TO" | tr 'A-F' 'a-f'); _hits=""; _n=0; _all=""
      for _f in "$S"/backups/*.json; do
        [ -f "$_f" ] || continue
        _h=${_f##*/}; _h=${_h%.json}
        kept "$_h" || continue
        _all="${_all:+$_all, }$(printf '%.12s' "$_h")"
        case $_h in "$_want"*) _hits=$_h; _n=$((_n + 1));; esac
      done
      if [ "$_n" -ne 1 ]; then
        [ "$_n" -eq 0 ] && _w=no || _w=several
        WHY="$_w backups match $TO (kept: ${_all:-none}); see vgpu-patch status (or status.yml)"; return 1
      fi
      BACKUP=$_hits; WHY="the backup matching $TO"; return 0;;
  esac
  rollback_stack
  _stack=""
  for _h in $STACK; do
    [ "$_h" = "$cur" ] && continue
    [ -f "$S/backups/$_h.so" ] && ! whole_backup "$_h" && continue  # kept, but not a whole library
    _stack="$_stack $_h"
  done
  _rec=""
  for _h in $RECORDED; do kept "$_h" && _rec=1 && break; done
  if [ -z "${_stack# }" ] && [ -z "$_rec" ]; then
    # no record of a swap that replaced a file kept here: the newest other whole backup, by its saved_at
    _best=""; _bt=""
    for _f in "$S"/backups/*.json; do
      [ -f "$_f" ] || continue
      _h=${_f##*/}; _h=${_h%.json}
      [ "$_h" != "$cur" ] && kept "$_h" || continue
      _l=""; IFS= read -r _l < "$_f" || true
      _t=${_l#*\"saved_at\": \"}; [ "$_t" = "$_l" ] && _t=""; _t=${_t%%\"*}
      if [ -z "$_best" ] || [ "$(printf '%s\n%s\n' "$_bt" "$_t" | sort | tail -n 1)" = "$_t" ]; then
        _best=$_h; _bt=$_t
      fi
    done
    [ -n "$_best" ] || { WHY="no backup to roll back to"; return 1; }
    BACKUP=$_best; WHY="no recorded swap replaced a kept file: the newest other whole backup"; return 0
  fi
  if [ -z "${_stack# }" ]; then
    WHY="no earlier file to roll back to (the live file is the oldest recorded: every swap has been rolled back);"
    WHY="$WHY pick a backup with --to SHA256"; return 1
  fi
  if [ "$TO" = vendor ]; then
    _p=${_stack# }; _p=${_p%% *}; WHY="vendor: the file before the first recorded swap"
  else
    _p=${_stack##* }; WHY="previous: the file before the last swap still in effect"
  fi
  if ! [ -f "$S/backups/$_p.so" ] || ! [ -f "$S/backups/$_p.json" ]; then
    WHY="the backup of $(printf '%.12s' "$_p") (${TO:-previous}) is missing from $S/backups; pick another with"
    WHY="$WHY --to SHA256"; return 1
  fi
  BACKUP=$_p
}

# print_backup: choose_backup's verdict for the controller: `ok<TAB>SHA256<TAB>WHY` or `refuse<TAB>WHY`
print_backup() {
  if choose_backup; then printf 'ok\t%s\t%s\n' "$BACKUP" "$WHY"; else printf 'refuse\t%s\n' "$WHY"; fi
}

# -- probe: read-only facts, one section each (vgpu_patch/deploy/facts.py parses them) -----------------------
section() { printf '\n@@vgpu %s\n' "$1"; }

# state_check: as root, never read through a state dir someone else controls (sets UNSAFE, prints why)
state_check() {
  UNSAFE=""
  if [ -L "$S" ]; then UNSAFE=1; echo "$S is a symlink"
  elif [ -d "$S" ]; then
    if [ "$(id -u)" = 0 ]; then
      bad=$(find "$S" \( -type l -o ! -user 0 -o -perm -002 -o \( -type d -perm -020 \) \) -print 2>/dev/null \
        | head -n 1)
    else
      bad=$(find "$S" -type l -print 2>/dev/null | head -n 1)
    fi
    if [ -L "$bad" ]; then UNSAFE=1; echo "$bad is a symlink inside $S"
    elif [ -n "$bad" ]; then UNSAFE=1; echo "$bad is not root's alone (owner $(stat -c %U "$bad"), mode $(stat -c %a "$bad"))"
    fi
  fi
}

probe() {
  S="$D/.vgpu-patch"
  section arch; uname -m
  section glibc; getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>&1 | head -n 1
  section uid; PROBED_ME=$(id -u); echo "$PROBED_ME"
  section flock; command -v flock || true
  section dir; [ -d "$D" ] && echo yes
  section df  # its last line counts
  p="$D"; while [ ! -d "$p" ]; do p=$(dirname "$p"); done; df -Pk "$p"
  section files
  for f in "$D/$LIB" "$D/$LIB".*; do
    n=${f##*/}
    # a tab or newline in a name would forge columns or lines: say which name, no more (parse_files warns)
    case $n in *"$TAB"*|*"$NL"*) printf 'X\t%s\n' "$(printf %s "$n" | tr '\t\n' '  ')"; continue;; esac
    if [ -L "$f" ]; then printf 'L\t%s\t%s\n' "$n" "$(readlink "$f")"; continue; fi
    [ -f "$f" ] || continue
    hash_of "$f"
    v=$(grep -a -o -m 1 'vgpu-patch-shim [0-9A-Za-z.+~_-]*' "$f")
    printf 'F\t%s\t%s\t%s\t%s\n' "$n" "$HASH" "$(stat -c '%s %i %a %u %g' "$f")" "$v"
  done
  section live; print_live
  # the build manifest a plugin image made by `vgpu-patch plugin-image` installs beside the library
  section plugin_manifest
  [ -f "$D/vgpu-patch-manifest.json" ] && [ ! -L "$D/vgpu-patch-manifest.json" ] \
    && { tr -d '\n' < "$D/vgpu-patch-manifest.json"; echo; }
  # never read through a symlink (as root it could point anywhere): a linked ld.so.preload is not read
  section preload
  [ -f "$D/ld.so.preload" ] && [ ! -L "$D/ld.so.preload" ] && { echo present; cat "$D/ld.so.preload"; }
  section state; state_check
  section backups
  if [ -z "$UNSAFE" ]; then
    for j in "$S"/backups/*.json; do
      [ -f "$j" ] || continue
      h=${j##*/}; h=${h%.json}
      if [ -f "$S/backups/$h.so" ]; then printf 'yes\t'; else printf 'no\t'; fi
      tr -d '\n' < "$j"; echo
    done
  fi
  # the signatures kept per sha256 (keep_signature): one line each, read by the shell itself (no process)
  section signatures
  if [ -z "$UNSAFE" ]; then
    for j in "$S"/signatures/*.json; do
      [ -f "$j" ] || continue
      h=${j##*/}; h=${h%.json}
      if [ -f "$S/signatures/$h.sig" ]; then printf 'yes\t'; else printf 'no\t'; fi
      l=""; IFS= read -r l < "$j"; printf '%s\n' "$l"
    done
  fi
  if [ -n "$TO" ] && [ -z "$UNSAFE" ]; then  # a rollback's target, for the live file choose_live chose
    section rollback
    cur=""; [ -n "$LIVE" ] && [ -f "$LIVE" ] && [ ! -L "$LIVE" ] && hash_of "$LIVE" && cur=$HASH
    print_backup
  fi
  section history
  [ -z "$UNSAFE" ] && [ -f "$S/history.jsonl" ] && tail -n "$HISTORY" "$S/history.jsonl"
  section pending  # a swap's record written before its rename, removed once recorded (swap_in, record)
  [ -z "$UNSAFE" ] && [ -f "$S/pending.json" ] && head -n 1 "$S/pending.json"
  if [ "$MAPS" = 1 ]; then section maps; maps; fi
  true
}

# -- the swap, one function a step (every check before the rename; after it only read-only re-checks) --------
# begin: the swap's clock, the clean-up trap and our uid; a dropped connection must not stop a swap half-way
begin() {
  trap '' HUP PIPE
  trap cleanup EXIT
  S="$D/.vgpu-patch"; ME=${PROBED_ME:-$(id -u)}
  NOW=$(date -u +%Y-%m-%dT%H:%M:%SZ); NOWJ="\"$NOW\""; WANTJ="\"$WANT\""
  TMP="$D/.${LIVE##*/}.vgpu-patch-tmp.$$"
  umask 022
}

# make_dir: --install on a node without the library directory: create it and its parents 0755 (begin's umask)
make_dir() {
  [ -d "$D" ] || { mkdir -p "$D" && chmod 0755 "$D"; } \
    || fail "$E_WRITE" "cannot create $D (run as root, or check the path)"
}

# safe_state: the state dir is trusted only when nobody but its owner (root, when we are root) can change it
# and it holds no symlinks: then nothing can redirect a write (lock, history, backups) after this check
safe_state() {
  [ -d "$D" ] || fail "$E_WRITE" "$D is not a directory"
  if [ -L "$S" ] || { [ -e "$S" ] && [ ! -d "$S" ]; }; then
    fail "$E_UNSAFE" "$S is a symlink or not a directory: refusing to write through it; remove it (nothing changed)"
  fi
  bad=""
  # a state dir this run creates itself (mkdir fails on an existing one) holds nothing to check
  if [ -e "$S" ] || ! mkdir "$S" "$S/backups" 2>/dev/null; then
    [ -d "$S/backups" ] || mkdir -p "$S/backups" || fail "$E_WRITE" "cannot create $S"
    if [ "$ME" = 0 ]; then
      bad=$(find "$S" \( -type l -o ! -user 0 -o -perm -002 -o \( -type d -perm -020 \) \) -print 2>/dev/null)
    else
      bad=$(find "$S" -type l -print 2>/dev/null)
    fi
    bad=${bad%%"$NL"*}  # the first one found
  fi
  if [ -n "$bad" ]; then
    [ -L "$bad" ] && fail "$E_UNSAFE" "$bad is a symlink inside $S: refusing to follow it; remove it (nothing changed)"
    m="$bad is not root's alone (owner $(stat -c %U "$bad"), mode $(stat -c %a "$bad")): refusing to use it as root;"
    fail "$E_UNSAFE" "$m chown -R root:root $S and chmod go-w, or remove it (nothing changed)"
  fi
}

lock() {
  if command -v flock >/dev/null 2>&1; then
    exec 9>>"$S/lock" || fail "$E_WRITE" "cannot open $S/lock"
    flock -n 9 || fail "$E_LOCKED" "locked"
  else
    mkdir "$S/lock.d" 2>/dev/null || fail "$E_LOCKED" "locked"; LOCKDIR="$S/lock.d"
  fi
  # temp files of a swap that was SIGKILLed: only a lock holder makes them, so any found now are orphans
  rmx "$D"/.*.vgpu-patch-tmp.* "$S"/staging/*.part.* "$S"/backups/.*.tmp.* "$S"/signatures/.*.tmp.*
  # uploads a dropped connection left (their swap never ran): a live one is seconds old, as its swap
  # starts right after it; older than 5 minutes it is an orphan, whoever's it was
  for f in ${UPDIR:+"$UPDIR"/.vgpu-patch-upload-*}; do
    [ -e "$f" ] && command -v find >/dev/null 2>&1 \
      && find "$UPDIR" -maxdepth 1 -name '.vgpu-patch-upload-*' -mmin +5 -exec rm -f {} + 2>/dev/null
    break
  done
}

# receive SIZE: the candidate's bytes, which follow the calls on stdin, straight into the temp file beside the
# live one (as root, under the lock, created new and 0600: never a planted file). No upload in /tmp.
receive() {
  umask 077; set -C  # noclobber: the redirection creates $TMP with O_EXCL
  head -c "$1" > "$TMP" || fail "$E_WRITE" "receiving the upload into $TMP failed (it exists, or disk full?)"
  set +C; umask 022; SRC="the upload"
}

# pause: a test seam: the controller runs its after-upload hook on the file named, then sends a line
pause() { printf '%s\n%s\n' "$TMP" '@@vgpu received'; read -r _ || true; }

# stage: the file to go live, copied as root beside the live one under the lock: what is verified below is
# what the rename puts in place (an upload stays its login user's to change until it is copied)
stage() {
  [ -n "$SRC" ] || SRC=$UP
  cp "$SRC" "$TMP" 2>&1 || fail "$E_WRITE" "copying $SRC to $TMP failed (disk full?)"
  if [ -n "$UP" ]; then rm -f "$UP"; UP=""; fi
}

# verify_source: the live file is copied aside first and that copy hashed with the candidate in one sha256sum:
# the backup, the history's from_sha256 and the no-op check all describe the bytes that were really there
verify_source() {
  cur=""
  if [ -e "$LIVE" ]; then
    BTMP="$S/backups/.live.tmp.$$"
    cp "$LIVE" "$BTMP" 2>&1 || fail "$E_WRITE" "backing up $LIVE failed (disk full?)"
    sums=$(sha256sum -- "$TMP" "$BTMP") || fail "$E_WRITE" "sha256sum of $TMP failed"
    cur=${sums#*"$NL"}; cur=${cur%%[ ]*}; cur=${cur#\\}
  else
    sums=$(sha256sum -- "$TMP") || fail "$E_WRITE" "sha256sum of $TMP failed"
  fi
  got=${sums%%[ ]*}; got=${got#\\}  # a name sha256sum had to escape starts its line with a backslash
  [ "$got" = "$WANT" ] || fail "$E_MISMATCH" "sha256 of $SRC is $got, expected $WANT"
  if [ "$cur" = "$WANT" ]; then echo "@@noop"; exit 0; fi
}

# load_test: LD_PRELOAD splits on spaces and colons: load the file through a link whose path has neither
load_test() {
  PRE="$TMP"
  case "$TMP" in *[[:space:]:]*)
    LT=$(mktemp -d /tmp/.vgpu-patch-load.XXXXXX) || fail "$E_WRITE" "cannot create a temp dir in /tmp"
    ln -s "$TMP" "$LT/libvgpu.so" && PRE="$LT/libvgpu.so";;
  esac
  out=$(LD_PRELOAD="$PRE" /bin/true 2>&1); rc=$?
  [ -n "$LT" ] && rm -rf "$LT"
  case "$out" in *"cannot be preloaded"*|*"ERROR: ld.so"*) rc=127;; esac
  [ "$rc" -eq 0 ] \
    || fail "$E_NOLOAD" "LD_PRELOAD of the new file made /bin/true fail (exit $rc): $(printf '%s' "$out" | head -n 1)"
}

# back_up: keep what is live now (it may differ from the plan: HAMi's plugin rewrites the file in place,
# outside any lock). The copy is hashed, so the backup's name and the history say what was replaced. A live
# file that is not a whole library (empty, or caught mid-copy) is replaced but never kept as a backup nor
# recorded as from_sha256 (REC): a rollback must never restore it.
back_up() {
  BK=""; FROMJ=null; REC=""
  [ -n "$BTMP" ] || return 0
  SIZE=$(stat -c %s "$BTMP"); CURJ="\"$cur\""; FROMJ="$CURJ"; REC="$cur"
  BK="$S/backups/$cur.so"
  if ! whole_lib "$BTMP" "$SIZE"; then
    BK=""; FROMJ=null; REC=""
    printf '@@partial %s\n' "$SIZE"
  elif [ -f "$BK" ] && [ -f "$S/backups/$cur.json" ] && hash_of "$BK" && [ "$HASH" = "$cur" ]; then
    :  # already kept; the copy is removed on exit
  else
    # the manifest first: one short write, and a manifest without its file reads as "not present" (a file
    # without one would be invisible); the next swap of this file rewrites both
    printf '{"sha256": %s, "size": %s, "path": %s, "saved_at": %s, "operator": %s, "tool": %s}\n' \
      "$CURJ" "$SIZE" "$LIVEJ" "$NOWJ" "$OPJ" "$TOOLJ" > "$S/backups/$cur.json" \
      || fail "$E_WRITE" "writing the backup manifest failed (disk full?)"
    mv -f "$BTMP" "$BK" || fail "$E_WRITE" "storing the backup failed"
    NEWBK=1  # made durable with the new file, before the rename
  fi
}

# keep_signature: the verified signature of what goes live, content-addressed by its sha256 beside the backups
# (signatures/<sha256>.sig, then .json naming the signer: a .json is shown only with its .sig), so status
# names who signed the live file, also after a rollback to it. A later verified signature of the same bytes
# (a re-signed build) replaces it. Under the lock, before the rename: made durable with the new file.
keep_signature() {
  [ -n "$SIG" ] || return 0
  [ -d "$S/signatures" ] || mkdir "$S/signatures" || fail "$E_WRITE" "cannot create $S/signatures"
  m="$S/signatures/.$WANT"
  { printf '%s\n' "$SIG" > "$m.sig.tmp.$$" && mv -f "$m.sig.tmp.$$" "$S/signatures/$WANT.sig"; } \
    || fail "$E_WRITE" "storing the signature in $S/signatures failed (disk full?)"
  { printf '{"sha256": %s, "signer": %s, "saved_at": %s, "operator": %s, "tool": %s}\n' \
      "$WANTJ" "$SIGNERJ" "$NOWJ" "$OPJ" "$TOOLJ" > "$m.json.tmp.$$" \
      && mv -f "$m.json.tmp.$$" "$S/signatures/$WANT.json"; } \
    || fail "$E_WRITE" "storing the signer in $S/signatures failed (disk full?)"
  NEWSIG=1
}

# swap_in: the live file's mode, owner and SELinux context onto the temp file, fsync, rename, (record syncs the
# directory). Never a cp over the live file.
swap_in() {
  if [ -n "$cur" ]; then
    keep=mode; [ "$ME" = 0 ] && keep=mode,ownership
    # the live file's mode (and owner, as root) in one process; without GNU cp's --attributes-only, two
    if ! cp --attributes-only --preserve="$keep" "$LIVE" "$TMP" 2>/dev/null; then
      chmod --reference="$LIVE" "$TMP" 2>/dev/null || chmod 0644 "$TMP"
      [ "$ME" = 0 ] && chown --reference="$LIVE" "$TMP" 2>/dev/null
    fi
    if [ -e /sys/fs/selinux/enforce ] && command -v chcon >/dev/null 2>&1; then
      chcon --reference="$LIVE" "$TMP" 2>/dev/null
    fi
  else
    chmod 0644 "$TMP"
  fi
  # on record before the rename (a kill right after it must not lose the swap): the history line goes to
  # pending.json, which record moves into the history; a pending.json left by a killed swap is settled first
  settle
  entry > "$S/pending.json" || fail "$E_WRITE" "writing $S/pending.json failed (disk full?); nothing changed"
  # the new file's bytes, a new backup's (bytes, manifest, name), a kept signature and the pending record,
  # before the rename
  sync "$TMP" ${NEWBK:+"$BK"} ${NEWBK:+"$S/backups/$cur.json"} "$S/backups" \
    ${NEWSIG:+"$S/signatures/$WANT.sig"} ${NEWSIG:+"$S/signatures/$WANT.json"} ${NEWSIG:+"$S/signatures"} \
    "$S/pending.json" "$S" 2>/dev/null || sync
  out=$(mv -f "$TMP" "$LIVE" 2>&1) \
    || fail "$E_WRITE" "renaming $TMP over $LIVE failed ($out; EBUSY: $LIVE is a mount point, act on the host file)"
}

reverify() {
  hash_of "$LIVE"; got=$HASH
  [ "$got" = "$WANT" ] || fail "$E_VERIFY" "after the swap $LIVE has sha256 $got, expected $WANT"
}

byte_compare() {
  if command -v cmp >/dev/null 2>&1; then cmp -s "$SRC" "$LIVE" || fail "$E_VERIFY" "$LIVE differs from $SRC byte for byte"; fi
}

# entry: this swap's history line
entry() {
  printf '{"time": %s, "action": %s, "path": %s, "from_sha256": %s, "to_sha256": %s, "operator": %s, "tool": %s%s}\n' \
    "$NOWJ" "$ACTJ" "$LIVEJ" "$FROMJ" "$WANTJ" "$OPJ" "$TOOLJ" "${SIGNERJ:+, \"signer\": $SIGNERJ}"
}

# settle: pending.json left by a swap killed between its rename and its record: that swap happened when its
# file is what this one found live (its to_sha256 is $cur), and goes into the history unless already there
settle() {
  [ -n "$cur" ] && [ -f "$S/pending.json" ] || return 0
  p=$(head -n 1 "$S/pending.json")
  case $p in *"\"to_sha256\": \"$cur\","*"}")  # whole (a line cut short never ends in a brace)
    if [ "$(tail -n 1 "$S/history.jsonl" 2>/dev/null)" != "$p" ]; then
      printf '%s\n' "$p" >> "$S/history.jsonl" || fail "$E_WRITE" "appending to $S/history.jsonl failed (disk full?)"
    fi;;
  esac
}

# record: the history line, then pending.json goes (a reader seeing both takes them as one swap)
record() {
  entry >> "$S/history.jsonl" \
    || fail "$E_WRITE" "the swap is done but appending to $S/history.jsonl failed (disk full?)"
  sync "$D" "$S/history.jsonl" 2>/dev/null || sync  # the rename (directory) and the record
  rm -f "$S/pending.json"
}

# report: the result line (what was replaced, its backup, the live inode), then with STALE=1 every process
# mapping the library (one grep over all /proc maps)
report() {
  if [ "$STALE" = 1 ]; then
    printf '@@ok\t%s\t%s\t%s\n' "${REC:--}" "${BK:--}" "$(stat -c %i "$LIVE")"
    printf '\n@@vgpu maps\n'
    maps
  else
    printf '@@ok\t%s\t%s\t-\n' "${REC:--}" "${BK:--}"
  fi
  exit 0
}

# -- the Ansible role: parameters from VGPU_* variables, the live file chosen here -----------------------
# VGPU_DIR VGPU_ACTION (deploy|rollback) VGPU_WANT VGPU_TO VGPU_INSTALL (1: install where no library is)
# VGPU_OPERATOR_JSON VGPU_TOOL_JSON VGPU_STALE (1: list the processes still mapping the library)
# VGPU_TO (rollback: previous | vendor | a backup's sha256, choose_backup). deploy: the candidate comes on stdin;
# VGPU_SIGNATURE and VGPU_SIGNER_JSON: its verified signature and signer, kept by keep_signature (else unsigned).
role_main() {
  D=$VGPU_DIR; WANT=$VGPU_WANT; OPJ=$VGPU_OPERATOR_JSON; TOOLJ=$VGPU_TOOL_JSON; ACTJ="\"$1\""; TO=${VGPU_TO:-}
  if [ "$1" = deploy ] && [ -n "${VGPU_SIGNATURE:-}" ]; then SIG=$VGPU_SIGNATURE; SIGNERJ=$VGPU_SIGNER_JSON; fi
  STALE=${VGPU_STALE:-0}
  [ -d "$D" ] || fail "$E_WRITE" "$D is not a directory: is HAMi installed? set vgpu_patch_target_dir"
  choose_live || fail "$E_AMBIGUOUS" "$WHY"
  [ -L "$LIVE" ] \
    && fail "$E_AMBIGUOUS" "$LIVE is a symlink to $(readlink "$LIVE"); replace the file it points at, or make it a file"
  [ -e "$LIVE" ] || [ "$VGPU_INSTALL" = 1 ] || fail "$E_WRITE" "no $LIB in $D to replace; check vgpu_patch_target_dir"
  LIVEJ=$(json_str "$LIVE")
  begin
  if [ "$1" = deploy ]; then  # saved 0600 (mktemp), removed by cleanup
    UP=$(mktemp "${TMPDIR:-/tmp}/.vgpu-patch-upload-XXXXXXXXXX") || fail "$E_WRITE" "cannot create an upload file in /tmp"
    UPDIR=${UP%/*}
    base64 -d > "$UP" || fail "$E_WRITE" "receiving the candidate on stdin failed (disk full?)"
  fi
  safe_state
  lock
  [ "$1" = rollback ] && pick_backup
  WANTJ="\"$WANT\""
  stage
  verify_source
  load_test
  back_up
  keep_signature
  swap_in
  reverify
  [ "$1" = rollback ] && byte_compare
  record
  report
}

# pick_backup: the role's rollback target, by the same rule as the CLI's (choose_backup), under the lock
pick_backup() {
  cur=""; [ -e "$LIVE" ] && hash_of "$LIVE" && cur=$HASH
  choose_backup || fail "$E_WRITE" "$WHY; nothing was changed"
  WANT=$BACKUP; SRC="$S/backups/$WANT.so"
}
