#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The MPI-IO mode with real MPI ranks: a contiguous and a chunked file from `solar gen`, read by
# 2 ranks with independent and with collective transfers, every sample checked.
set -euo pipefail
solar=$1 reader=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/solar-mpio-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
for layout in contiguous chunked; do
  "$solar" gen "$work/$layout.h5" --samples 301 --preset tiny --layout "$layout" --seed 5 --no-progress >/dev/null
  for mode in independent collective; do
    echo "== $layout, $mode"
    mpirun -np 2 "$reader" "$work/$layout.h5" "$mode"
  done
done
