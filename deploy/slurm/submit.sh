#!/bin/bash
# Submit a sweep to Slurm in three steps:
#   1. db-init.sbatch runs `sweeper db init` once;
#   2. sweeper-array.sbatch starts one host per array task, only if the init
#      succeeded (afterok). A failed init cancels it (--kill-on-invalid-dep);
#   3. SWEEPER_SEGMENTS - 1 more arrays follow (default: none). Each starts once
#      the previous array has ended (afterany) and resumes the study. That carries
#      a sweep past the partition's time limit.
#
# Usage: deploy/slurm/submit.sh [sbatch options for the host arrays]
#   e.g. deploy/slurm/submit.sh --array=0-7 --gres=gpu:4 --cpus-per-task=8 --mem=64G
# Options that every job needs go in sbatch's own environment variables, e.g.
# SBATCH_ACCOUNT=quant SBATCH_PARTITION=gpu deploy/slurm/submit.sh
#
# Inputs: deploy/slurm/sweeper.env (or the file SWEEPER_SLURM_ENV names). Values
# already in the environment win. sbatch exports this environment to the jobs.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
die() { echo "submit.sh: $*" >&2; exit 2; }

env_file="${SWEEPER_SLURM_ENV:-$here/sweeper.env}"
[[ -f "$env_file" ]] || die "$env_file: no such file (SWEEPER_SLURM_ENV)"
# shellcheck source=sweeper.env
source "$env_file"
# sbatch copies the environment into Slurm's job records (and, with
# AccountingStoreFlags=job_env, into the accounting database): no password there.
[[ -z "${PGPASSWORD:-}" ]] || die "PGPASSWORD is set: sbatch would copy it into Slurm's job records; unset it and use PGPASSFILE (mode 0600)"
[[ -f "${SWEEPER_STUDY:-}" ]] || die "SWEEPER_STUDY=${SWEEPER_STUDY:-}: no such file (set it in $env_file)"
segments="${SWEEPER_SEGMENTS:-1}"
[[ "$segments" =~ ^[1-9][0-9]*$ ]] || die "SWEEPER_SEGMENTS=$segments: expected a whole number >= 1"

# `sbatch --parsable` prints "jobid" or "jobid;cluster"; dependencies take the job id
submit() {
  local out
  out="$(sbatch --parsable "$@")" || return
  echo "${out%%;*}"
}

init="$(submit "$here/db-init.sbatch")"
echo "db init: job $init"
array="$(submit --dependency="afterok:$init" --kill-on-invalid-dep=yes "$@" "$here/sweeper-array.sbatch")"
echo "hosts: array job $array (starts after $init succeeds)"
for ((k = 2; k <= segments; k++)); do
  array="$(submit --dependency="afterany:$array" "$@" "$here/sweeper-array.sbatch")"
  echo "hosts, segment $k: array job $array (starts after the previous array ends)"
done
