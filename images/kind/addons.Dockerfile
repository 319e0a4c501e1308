# The images a kind node preloads besides the control plane's, built here because no registry
# can be reached (`python -m clusters.kind_node` builds each target and tags it with the name
# kubeadm v1.34 or kind v0.30.0 asks for). The build context (clusters/kind_node.py) holds the
# static binaries built from Go modules and the two small programs beside this file.
#
#   target                  tagged                                       from
#   pause                   registry.k8s.io/pause:3.10.1                 images/kind/pause (Go)
#   coredns                 registry.k8s.io/coredns/coredns:v1.12.1      github.com/coredns/coredns
#   kube-proxy              registry.k8s.io/kube-proxy:v1.34.4           k8s.io/kubernetes cmd/kube-proxy
#   kindnetd                docker.io/kindest/kindnetd:<kind's tag>      images/kind/kindnetd (Go)
#   local-path-provisioner  docker.io/kindest/local-path-provisioner:..  github.com/rancher/local-path-provisioner
#   local-path-helper       docker.io/kindest/local-path-helper:...      Debian (sh, mkdir, rm)
# INPUTS (a digest of what each image is built from) becomes a label: clusters/kind_node.py
# rebuilds an image whose label differs.
ARG DEBIAN_IMAGE=debian:bookworm-slim
ARG PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# The pod sandbox: upstream's runs as 65535 on an empty image.
FROM scratch AS pause
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]

# kubeadm's CoreDNS Deployment gives only args (-conf ...) and the NET_BIND_SERVICE capability;
# upstream's image runs /coredns with a file capability as nonroot. There is no setcap in an
# empty image, so this one runs as root, which the capability set still confines.
FROM scratch AS coredns
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}
ARG PATH_ENV
ENV PATH=${PATH_ENV}
COPY coredns /coredns
EXPOSE 53 53/udp
ENTRYPOINT ["/coredns"]

# The provisioner is started by name (command: local-path-provisioner ...), so PATH is set.
FROM scratch AS local-path-provisioner
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}
ARG PATH_ENV
ENV PATH=${PATH_ENV}
COPY local-path-provisioner /usr/local/bin/local-path-provisioner
ENTRYPOINT ["/usr/local/bin/local-path-provisioner"]

# The helper pod runs the ConfigMap's setup/teardown shell scripts: sh, mkdir, rm.
FROM ${DEBIAN_IMAGE} AS local-path-helper
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}

# kube-proxy execs iptables, ip6tables, their -save/-restore and conntrack; upstream's image is
# distroless-iptables with a backend-selecting wrapper, as iptables-wrapper does here.
FROM ${DEBIAN_IMAGE} AS netbase
RUN apt-get update -q \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        iptables conntrack ipset iproute2 kmod \
    && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
COPY iptables-wrapper /usr/local/lib/iptables-wrapper
RUN for name in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do \
        ln -sf /usr/local/lib/iptables-wrapper "/usr/sbin/${name}"; \
    done

FROM netbase AS kube-proxy
COPY kube-proxy /usr/local/bin/kube-proxy
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}

FROM netbase AS kindnetd
COPY kindnetd /bin/kindnetd
ARG INPUTS=unknown
LABEL org.trainjob.inputs=${INPUTS}
ENTRYPOINT ["/bin/kindnetd"]
