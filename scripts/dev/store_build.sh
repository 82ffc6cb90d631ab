#!/usr/bin/env bash
# scripts/dev/store_build.sh FILES_AT: file the parts a `remote.sh packbuild patched|pristine` reply brought back (its
# files_at folder) as .device-bench/gbp0, gbp1, .. (patched) or gbq0, .. (pristine), three 15 MiB parts a folder so
# that each `part bpN` / `part bqN` call carries one folder within the 64 MiB a call takes; the key and sha256 go
# with the first folder. A later machine's `remote.sh start` unpacks them instead of building when the key matches.
set -euo pipefail
src=${1:?the reply\'s files_at folder}
cd "$(dirname "$0")/../.."
found=0
for which in patched pristine; do
    parts=("$src"/build-$which.txz.??)
    [ -e "${parts[0]}" ] || continue
    found=1
    tag=$([ $which = patched ] && echo bp || echo bq)
    rm -rf .device-bench/g${tag}[0-9]*
    n=0
    for f in "${parts[@]}"; do
        d=.device-bench/g${tag}$((n / 3))
        mkdir -p $d && cp "$f" $d/ && chmod u+w $d/"$(basename "$f")"
        n=$((n + 1))
    done
    cp "$src"/build-$which.key "$src"/build-$which.sha256 .device-bench/g${tag}0/
    chmod u+w .device-bench/g${tag}0/*
    echo "$which: $n part(s), key $(cat .device-bench/g${tag}0/build-$which.key): stage with" \
        "$(ls -d .device-bench/g${tag}[0-9]* | sed 's:.*/g:part :' | paste -sd, -) before start"
done
[ $found = 1 ] || { echo "store_build: no build-*.txz.NN in $src" >&2; exit 2; }
