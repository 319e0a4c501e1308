"""The two scripts of the Flux ConfigMap (``init.sh``, ``entrypoint.sh``) and the broker
configuration ``init.sh`` writes, for one TrainJob.

The scripts are this project's own. What they must agree on with the Flux view image and
with the pod layout the flux plug-in builds is fixed: the view is copied to ``VIEW_BASE``
(shared ``flux-install`` volume), the spack tree to ``/opt/software``, the CURVE certificate
is mounted at ``/curve/curve.cert``, and the first node pod runs the lead broker. Their text
differs from upstream Trainer's (the conformance run lists the ConfigMap's data as an
intended difference); the commands they run and the configuration they write do not.
"""

from __future__ import annotations

import shlex

# Where the installer copies the Flux view, and where both scripts expect it.
VIEW_BASE = "/mnt/flux"
# The Flux install inside the view image (its spack view).
VIEW_ROOT = "/opt/view"
SPACK_ROOT = "/opt/software"
CURVE_MOUNT = "/curve/curve.cert"
DOMAIN_SUFFIX = "svc.cluster.local"
BROKER_PORT = 8050
# How long a follower broker waits before it tries to join the lead broker again.
FOLLOWER_RETRY_SECONDS = 15

_CONFIG = f"{VIEW_BASE}/config"
_SYSTEM = f"{_CONFIG}/etc/flux/system"
_BROKER_CONFIG_DIR = f"{_CONFIG}/etc/flux/config"
_CURVE = f"{_CONFIG}/etc/curve/curve.cert"
_STATE = f"{_CONFIG}/var/lib/flux"
_RUNDIR = f"{_CONFIG}/run/flux"


def index_range(size: int, start: int = 0) -> str:
    """``start`` alone for one item, else ``start-last`` (Flux's idset notation)."""
    return str(start) if size == 1 else f"{start}-{start + size - 1}"


def hostlist(job_name: str, nodes: int) -> str:
    """The node pods' hostnames as a Flux hostlist: the first Job of replicated job ``node``,
    completion indexes 0..nodes-1."""
    return f"{job_name}-node-0-[{index_range(nodes)}]"


def broker_toml(job_name: str, namespace: str, hosts: str, network_device: str,
                queue_policy: str) -> str:
    """The broker configuration: bind on the pod's network device, reach the other brokers
    through the JobSet's headless Service (named like the job), fluxion's queue policy."""
    connect_domain = f"{job_name}.{namespace}.{DOMAIN_SUFFIX}"
    return "\n".join([
        "[access]",
        "allow-guest-user = true",
        "allow-root-owner = true",
        "",
        "[resource]",
        f'path = "{_SYSTEM}/R"',
        "",
        "[bootstrap]",
        f'curve_cert = "{_CURVE}"',
        f"default_port = {BROKER_PORT}",
        f'default_bind = "tcp://{network_device}:%p"',
        f'default_connect = "tcp://%h.{connect_domain}:%p"',
        f'hosts = [{{ host = "{hosts}" }}]',
        "",
        "[archive]",
        f'dbpath = "{_STATE}/job-archive.sqlite"',
        'period = "1m"',
        'busytimeout = "50s"',
        "",
        "[sched-fluxion-qmanager]",
        f'queue-policy = "{queue_policy}"',
        "",
    ])


def _script(*blocks: str) -> str:
    return "#!/bin/bash\n" + "\n".join(block.strip("\n") + "\n" for block in blocks)


def init_script(hosts: str, broker: str) -> str:
    """Run by the installer init container (the view image): lays out the configuration
    tree on the shared volume, writes the hostlist and broker configuration, and copies the
    view and spack tree out of the image for the node container."""
    return _script(
        "set -eu",
        f"""
# The configuration tree the brokers read and write.
mkdir -p {_SYSTEM}/cron.d {_BROKER_CONFIG_DIR} {_STATE} {_RUNDIR} {_CONFIG}/etc/curve
echo {shlex.quote(hosts)} > {_SYSTEM}/hostlist
cat > {_BROKER_CONFIG_DIR}/broker.toml <<'BROKER'
{broker.rstrip(chr(10))}
BROKER
echo "broker configuration:"
cat {_BROKER_CONFIG_DIR}/broker.toml
""",
        f"""
# {VIEW_ROOT} links into spack's view directory; copy what it points at, and the spack
# tree its files link to, so the node container (any image) can run Flux.
view_dir=$(ls -d /opt/views/._view/*/ | head -n 1)
mkdir -p {VIEW_BASE}/view
cp -R "$view_dir". {VIEW_BASE}/view/
cp -R {SPACK_ROOT} {VIEW_BASE}/
touch {VIEW_BASE}/install-done
echo "Flux view installed under {VIEW_BASE}"
""")


def entrypoint_script(resource_spec: str, main_host: str, run_flags: str) -> str:
    """Run by every node container with the trainer's command as its one argument.
    ``resource_spec``: the ``flux R encode`` options after ``--hosts`` (cores, GPUs);
    ``main_host``: the hostname of the pod that runs the lead broker; ``run_flags``:
    ``flux run``'s sizing."""
    return _script(
        f"""
command="$*"
view={VIEW_BASE}/view
export PATH="$PATH:$view/bin"
# The view's files link into the spack tree at its original place.
cp -R {VIEW_BASE}/software/. {SPACK_ROOT}/

# Flux's Python modules are those of the view's own Python.
python_lib=$(find "$view/lib" -maxdepth 1 -type d -name 'python3*' | head -n 1)
if [ -n "$python_lib" ] && [ -x "$view/bin/$(basename "$python_lib")" ]; then
  ln -sf "$view/bin/$(basename "$python_lib")" "$view/lib/python3" || true
fi
export PYTHONPATH="${{PYTHONPATH:-}}:$python_lib/site-packages"
export FLUX_RC_EXTRA="$view/etc/flux/rc1.d"
""",
        f"""
# Helpers a user can source or run inside the pod.
cat > {VIEW_BASE}/flux-view.sh <<EOT
export PATH=$PATH
export PYTHONPATH=$PYTHONPATH
export LD_LIBRARY_PATH=${{LD_LIBRARY_PATH:-}}:$view/lib
export fluxsocket=local://{_RUNDIR}/local
EOT
printf '%s\\n' 'flux module remove sched-simple' 'flux module load sched-fluxion-resource' \\
  'flux module load sched-fluxion-qmanager' > {VIEW_BASE}/load-fluxion.sh
""",
        f"""
# The broker refuses a certificate others can read.
cp {CURVE_MOUNT} {_CURVE}
chmod go-r {_CURVE}
chown "$(id -u)" {_CURVE}

hosts=$(cat {_SYSTEM}/hostlist)
flux R encode --hosts="$hosts" {resource_spec} > {_SYSTEM}/R
export STATE_DIR={_STATE}
export FLUX_OUTPUT_DIR=/tmp/fluxout
mkdir -p "$STATE_DIR" "$FLUX_OUTPUT_DIR" {_SYSTEM}/cron.d
options="-Scron.directory={_SYSTEM}/cron.d -Stbon.fanout=256 -Srundir={_RUNDIR}"
options="$options -Sstatedir=$STATE_DIR -Slocal-uri=local://{_RUNDIR}/local"
options="$options -Slog-stderr-level=0 -Slog-stderr-mode=local"
""",
        f"""
if [ "$(hostname)" = {shlex.quote(main_host)} ]; then
  if [ -z "$command" ]; then
    # No command: an interactive cluster that runs until the pod is stopped.
    echo "starting the lead broker"
    exec flux broker --config-path {_BROKER_CONFIG_DIR} $options
  fi
  echo "running under Flux: $command"
  flux start -o --config {_BROKER_CONFIG_DIR} $options flux run {run_flags} $command
  status=$?
else
  # A follower joins the lead broker; until that broker is up, it fails and tries again.
  until flux start -o --config {_BROKER_CONFIG_DIR} $options; do
    echo "follower broker exited with $?; retrying in {FOLLOWER_RETRY_SECONDS}s"
    sleep {FOLLOWER_RETRY_SECONDS}
  done
  status=0
fi
touch {VIEW_BASE}/run-done
exit $status
""")
