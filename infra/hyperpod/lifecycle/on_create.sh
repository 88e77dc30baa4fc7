#!/usr/bin/env bash
# OnCreate lifecycle script of the mazerl HyperPod cluster (EKS orchestrator).
#
# HyperPod copies the SourceS3Uri prefix (this directory) to each new node and runs this script
# once, as root, before the node joins the EKS cluster; a replacement node runs it again. A
# non-zero exit fails the node (and, during CreateCluster, the cluster), so only what the node
# cannot work without may fail here. On EKS the node's Kubernetes setup (kubelet, containerd,
# device plugins, the HyperPod health agent) is HyperPod's and the Helm chart's job, not this
# script's; it does two things:
#   1. logs to /var/log/provision/provisioning.log (and stdout, which HyperPod sends to the
#      cluster's CloudWatch log group), so a failed node can be diagnosed;
#   2. formats and mounts the instance-store NVMe disks (RAID 0 when there are several) at
#      /opt/dlami/nvme for node-local scratch (Ray object spilling, compile caches), unless
#      something already mounted it. A failure here is logged and does not fail the node:
#      scratch space is an optimisation, /shared (FSx for Lustre) holds everything that matters.
# The extra EBS volume of the instance group is mounted by HyperPod itself at /opt/sagemaker.
set -euo pipefail

# HyperPod sets none of these; the overrides let the script be exercised off a node.
LOG_DIR=${MAZERL_LOG_DIR:-/var/log/provision}
NVME_MOUNT=${MAZERL_NVME_MOUNT:-/opt/dlami/nvme}
FSTAB=${MAZERL_FSTAB:-/etc/fstab}
LOG_FILE="$LOG_DIR/provisioning.log"
NVME_MODEL="Amazon EC2 NVMe Instance Storage"

mkdir -p "$LOG_DIR"
exec > >(tee -a "$LOG_FILE") 2>&1

log() {
    printf '%s on_create: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"
}

# Prints the instance-store NVMe devices that are free: not mounted, not partitioned, not part of
# an array (its log lines go to stderr). EBS volumes (root, /opt/sagemaker) report another model
# name and are never touched.
free_nvme_devices() {
    local dev
    while read -r dev; do
        if [[ $(lsblk -nro NAME "$dev" | wc -l) -gt 1 ]]; then
            log "$dev has partitions or holders; left alone" >&2
        elif [[ -n $(lsblk -nro MOUNTPOINT "$dev" | tr -d '[:space:]') ]]; then
            log "$dev is mounted; left alone" >&2
        else
            printf '%s\n' "$dev"
        fi
    done < <(lsblk -dpno NAME,MODEL | awk -v model="$NVME_MODEL" 'index($0, model) { print $1 }')
}

# Errors return 1 explicitly: `set -e` does not apply inside a function called from `if`.
prepare_nvme() {
    local -a devices
    local target
    if mountpoint -q "$NVME_MOUNT"; then
        log "$NVME_MOUNT is already mounted; nothing to do"
        return 0
    fi
    mapfile -t devices < <(free_nvme_devices)
    if [[ ${#devices[@]} -eq 0 ]]; then
        log "no free instance-store NVMe device; no scratch volume"
        return 0
    fi
    target=${devices[0]}
    if [[ ${#devices[@]} -gt 1 ]]; then
        if command -v mdadm >/dev/null 2>&1; then
            mdadm --create /dev/md/mazerl-nvme --run --level=0 \
                --raid-devices="${#devices[@]}" "${devices[@]}" || return 1
            target=/dev/md/mazerl-nvme
        else
            log "mdadm is not installed; using $target alone"
        fi
    fi
    log "formatting $target (${#devices[@]} device(s): ${devices[*]})"
    mkfs.xfs -f -q "$target" || return 1
    mkdir -p "$NVME_MOUNT" || return 1
    mount -o noatime "$target" "$NVME_MOUNT" || return 1
    chmod 1777 "$NVME_MOUNT" || return 1
    # Survives a reboot of the same instance; nofail: a stop/start empties the instance store.
    printf 'UUID=%s %s xfs noatime,nofail 0 2\n' "$(blkid -s UUID -o value "$target")" \
        "$NVME_MOUNT" >>"$FSTAB" || return 1
    log "mounted $target at $NVME_MOUNT ($(df -h --output=size "$NVME_MOUNT" | tail -n 1 | tr -d ' '))"
}

log "start on $(hostname)"
if ! prepare_nvme; then
    log "WARNING: preparing the instance-store NVMe failed; continuing without $NVME_MOUNT"
fi
log "done"
sync
