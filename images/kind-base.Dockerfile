# kind's node base image (the image `kind build node-image --base-image` starts from), built
# from Debian's packages and Go modules where kind's own images/base cannot be: it clones and
# builds containerd, runc, crictl and the CNI plugins from git, which this machine cannot reach.
# `python -m clusters.kind_node` builds it as trainjob/kind-base:<kind version>.
#
# The build context (assembled by clusters/kind_node.py, never kept in the repository):
#   files/          kind's images/base/files, read from the kind module in the Go module cache
#                   (entrypoint, clean-install, systemd units, containerd and kubelet config)
#   containerd, ctr, containerd-shim-runc-v2
#                   github.com/containerd/containerd/v2 at the release kind pins (v2.1.4),
#                   built from its module with kind's build tags
#   crictl          sigs.k8s.io/cri-tools cmd/crictl, built from its module
#   oci-runtime     clusters/oci_runtime.py: the capability-trimming runtime in front of runc
#
# What differs from kind's images/base, and why:
#   * runc (1.1) and the CNI plugins (1.1) are Debian bookworm's packages (kind builds runc 1.3,
#     which needs cgo, and plugins 1.7 from git). Debian's containerd (1.6) is not used: kind
#     v0.30.0 calls `ctr info` and `ctr images import --label`, which containerd 1.6 lacks.
#   * no containerd-fuse-overlayfs (kind uses it only for rootless nodes on filesystems without
#     overlay): its proxy plugin is dropped from config.toml and its unit from systemd.
#   * no nfs-common / open-iscsi (network-backed volumes; the harness has none).
#   * containerd runs runc through oci-runtime (BinaryName): a privileged pod (kube-proxy)
#     asks for every capability and the node, like this machine, lacks CAP_SYS_RESOURCE, so
#     plain runc refuses it ("unable to apply caps"). Where nothing is missing the wrapper only
#     execs runc. Debian's python3 runs it (python3-minimal lacks json).
#   * the sandbox image is kubeadm's pause (PAUSE_IMAGE, 3.10.1 for v1.34) rather than kind's
#     3.10, so kubeadm's preflight agrees and one pause image serves both.
#   * restrict_oom_score_adj = true (kind sets it only for rootless nodes): without
#     CAP_SYS_RESOURCE nothing in the node may lower an oom_score_adj, so runc fails every
#     critical pod ("nsexec: failed to update /proc/self/oom_score_adj: Permission denied",
#     kubelet asks -998 for sandboxes and -997 for static pods). With it containerd raises a
#     pod's value to its own (0 here, as systemd cannot apply the unit's -999 either); on a
#     host that has the capability containerd runs at -999 and nothing changes.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE} AS build

COPY files/usr/local/bin/ /usr/local/bin/

# The packages of kind's images/base (less fuse-overlayfs, nfs-common, open-iscsi), plus
# Debian's runc and CNI plugins in place of kind's git builds, and python3 for oci-runtime.
# The clean-up of systemd units is upstream's. (The module cache keeps no execute bits.)
RUN chmod 0755 /usr/local/bin/* \
    && echo "Installing Packages ..." \
    && DEBIAN_FRONTEND=noninteractive clean-install \
      systemd \
      conntrack iptables nftables iproute2 ethtool util-linux mount kmod \
      libseccomp2 pigz \
      bash ca-certificates curl jq procps \
      runc containernetworking-plugins \
      python3 \
    && find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete \
    && rm -f /lib/systemd/system/multi-user.target.wants/* \
    && rm -f /etc/systemd/system/*.wants/* \
    && rm -f /lib/systemd/system/local-fs.target.wants/* \
    && rm -f /lib/systemd/system/sockets.target.wants/*udev* \
    && rm -f /lib/systemd/system/sockets.target.wants/*initctl* \
    && rm -f /lib/systemd/system/basic.target.wants/* \
    && echo "ReadKMsg=no" >> /etc/systemd/journald.conf \
    && ln -sf "$(which systemd)" /sbin/init

# kind's files go in after the packages (apt's layer stays cached while they change).
COPY files/kind/ /kind/
COPY files/LICENSES/ /LICENSES/
COPY files/etc/crictl.yaml /etc/crictl.yaml
COPY files/etc/containerd/ /etc/containerd/
COPY files/etc/default/ /etc/default/
COPY files/etc/sysctl.d/ /etc/sysctl.d/
COPY files/etc/systemd/system/ /etc/systemd/system/
COPY crictl containerd ctr containerd-shim-runc-v2 /usr/local/bin/
COPY oci-runtime /usr/local/bin/oci-runtime
# Upstream's permissions: scripts and directories 0755, everything else 0644.
RUN chmod -R u=rwX,go=rX /kind /LICENSES /etc/containerd /etc/default /etc/sysctl.d \
        /etc/systemd/system /etc/crictl.yaml \
    && chmod 0755 /usr/local/bin/* /kind/bin/*

# containerd looks for the CNI plugins in /opt/cni/bin; Debian installs them in /usr/lib/cni.
RUN mkdir -p /opt/cni/bin \
    && for plugin in /usr/lib/cni/*; do ln -s "$plugin" /opt/cni/bin/; done \
    && rm -f /etc/systemd/system/containerd-fuse-overlayfs.service \
    && python3 -c "import json, os, sys" \
    && oci-runtime --version \
    && containerd --version && runc --version && crictl --version

# containerd's configuration: kind's, less the fuse-overlayfs proxy plugin, with kubeadm's
# pause image, runc behind oci-runtime and oom_score_adj restricted. The base
# runtime spec is made as upstream makes it (ctr oci spec, kind's product-files hook, no
# rlimits).
ARG PAUSE_IMAGE=registry.k8s.io/pause:3.10.1
RUN sed -i -e '/^\[proxy_plugins\]/,/^$/d' \
        -e "s#^\( *sandbox_image\) = .*#\1 = \"${PAUSE_IMAGE}\"#" \
        -e 's#^\( *\)SystemdCgroup = true#&\n\1BinaryName = "/usr/local/bin/oci-runtime"#' \
        -e 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' \
        /etc/containerd/config.toml \
    && ! grep -q fuse-overlayfs /etc/containerd/config.toml \
    && test "$(grep -c 'BinaryName = "/usr/local/bin/oci-runtime"' /etc/containerd/config.toml)" = 2 \
    && grep -q 'restrict_oom_score_adj = true' /etc/containerd/config.toml \
    && grep -q "sandbox_image = \"${PAUSE_IMAGE}\"" /etc/containerd/config.toml \
    && ctr oci spec \
        | jq '.hooks.createContainer[.hooks.createContainer| length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
        | jq 'del(.process.rlimits)' \
        > /etc/containerd/cri-base.json \
    && jq -e '.hooks.createContainer | length == 1' /etc/containerd/cri-base.json

# NOTE: systemd-binfmt.service would register things into binfmt_misc, which is kernel-global.
RUN echo "Enabling / Disabling services ... " \
    && systemctl enable kubelet.service \
    && systemctl enable containerd.service \
    && systemctl enable undo-mount-hacks.service \
    && systemctl mask systemd-binfmt.service \
    && mkdir -p /etc/kubernetes/manifests

# Squashed to one layer, as upstream does, with upstream's metadata.
FROM scratch
COPY --from=build / /
# What clusters/kind_node.py built it from (a digest), to tell when to rebuild.
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}
# systemd checks the container variable (https://systemd.io/CONTAINER_INTERFACE/).
ENV container=docker
# systemd exits on SIGRTMIN+3, not SIGTERM (which re-executes it).
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT [ "/usr/local/bin/entrypoint", "/sbin/init" ]
