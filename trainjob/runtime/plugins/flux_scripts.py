"""The text of the Flux ConfigMap (``init.sh``, ``entrypoint.sh``) and of the broker
configuration that ``init.sh`` writes, for one TrainJob.

Why the bytes are fixed: upstream Trainer v2.3 writes these scripts into the
``<trainjob>-flux-entrypoint`` ConfigMap, and the pods of its Flux view image run them. A
JobSet and ConfigMap made by this operator must be the same objects upstream's controller
makes (a TrainJob may move between a worker running upstream and one running this operator,
and the conformance run compares both field by field), so every byte of the script text is
part of the contract, the shell comments and banner lines included. Only the values below
vary with the TrainJob; the fixed parts are kept as plain text blocks between them, in the
order the script runs.
"""

from __future__ import annotations

# Where the installer copies the Flux view, and where both scripts expect it.
VIEW_BASE = "/mnt/flux"
# The Flux install inside the view image (its spack view).
VIEW_ROOT = "/opt/view"
DOMAIN_SUFFIX = "svc.cluster.local"
BROKER_PORT = 8050

# The Apache-2.0 notice both scripts start with, one comment line per entry.
_NOTICE = (
    "Copyright The Kubeflow Authors.",
    "",
    'Licensed under the Apache License, Version 2.0 (the "License");',
    "you may not use this file except in compliance with the License.",
    "You may obtain a copy of the License at",
    "",
    "    http://www.apache.org/licenses/LICENSE-2.0",
    "",
    "Unless required by applicable law or agreed to in writing, software",
    'distributed under the License is distributed on an "AS IS" BASIS,',
    "WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.",
    "See the License for the specific language governing permissions and",
    "limitations under the License.",
)


def _preamble() -> str:
    notice = "".join(f"# {line}\n" if line else "#\n" for line in _NOTICE)
    return notice + "\n#!/bin/sh\n"


def index_range(size: int, start: int = 0) -> str:
    """``start`` alone for one item, else ``start-last`` (Flux's idset notation)."""
    return str(start) if size == 1 else f"{start}-{start + size - 1}"


def hostlist(job_name: str, nodes: int) -> str:
    """The node pods' hostnames as a Flux hostlist: the first Job of replicated job ``node``,
    completion indexes 0..nodes-1."""
    return f"{job_name}-node-0-[{index_range(nodes)}]"


def broker_toml(job_name: str, namespace: str, hosts: str, network_device: str,
                queue_policy: str) -> str:
    """The broker configuration: bind on the pod's device, reach peers through the JobSet's
    headless service (named like the job), fluxion's queue policy."""
    config = VIEW_BASE + "/config"
    connect_domain = f"{job_name}.{namespace}.{DOMAIN_SUFFIX}"
    lines = [
        "[access]",
        "allow-guest-user = true",
        "allow-root-owner = true",
        "",
        "# Point to resource definition generated with flux-R(1).",
        "[resource]",
        f'path = "{config}/etc/flux/system/R"',
        "",
        "[bootstrap]",
        f'curve_cert = "{config}/etc/curve/curve.cert"',
        f"default_port = {BROKER_PORT}",
        f'default_bind = "tcp://{network_device}:%p"',
        f'default_connect = "tcp://%h.{connect_domain}:%p"',
        "hosts = [",
        f'{{ host="{hosts}"}},',
        "]",
        "",
        "[archive]",
        f'dbpath = "{config}/var/lib/flux/job-archive.sqlite"',
        'period = "1m"',
        'busytimeout = "50s"',
        "",
        "[sched-fluxion-qmanager]",
        f'queue-policy = "{queue_policy}"',
    ]
    return "\n".join(lines) + "\n"


# init.sh, run by the installer init container: prepares the config tree on the shared
# volume, writes the hostlist and broker.toml, copies the view out of the image.
_INIT_SETUP = """
# We need to "install" config assets separately. We may not have write to /opt/view.
installRoot=/mnt/flux/config
echo "Hello I am hostname $(hostname) running setup."

# Always use verbose, no reason to not here
echo "Flux install root: ${fluxroot}"
export fluxroot

# Add flux to the path (if using view)
export PATH=/opt/view/bin:$PATH

# If the view doesn't exist, ensure basic paths do
mkdir -p $fluxroot/bin

# Cron directory
mkdir -p $installRoot/etc/flux/system/cron.d
mkdir -p $installRoot/var/lib/flux

# These actions need to happen on all hosts
mkdir -p $installRoot/etc/flux/system
"""

_INIT_BROKER_OPEN = """
# Echo hosts here in case the main container needs to generate
echo "${hosts}" > ${installRoot}/etc/flux/system/hostlist

# Write the broker configuration
mkdir -p ${installRoot}/etc/flux/config
cat <<EOT >> ${installRoot}/etc/flux/config/broker.toml
"""

_INIT_COPY_VIEW = """EOT

echo
echo "\U0001f438 Broker Configuration"
cat ${installRoot}/etc/flux/config/broker.toml

# The rundir needs to be created first, and owned by user flux
# Along with the state directory and curve certificate
mkdir -p ${installRoot}/run/flux ${installRoot}/etc/curve

viewroot=/mnt/flux
mkdir -p $viewroot/view

# Now prepare to copy finished spack view over
echo "Moving content from /opt/view to be in shared volume at $viewroot"
# Note that /opt/view is a symlink to here
view=$(ls /opt/views/._view/)
view="/opt/views/._view/${view}"

# We have to move both of these paths - spack makes link to /opt/software
# /opt/software will need to be restored in application container
cp -R ${view}/* $viewroot/view
cp -R /opt/software $viewroot/

# This is a marker to indicate the copy is done
touch $viewroot/flux-operator-done.txt
echo "Application is done."
"""


def init_script(job_name: str, hosts: str, broker: str) -> str:
    return (_preamble()
            + f"fluxroot={VIEW_ROOT}\nmainHost={job_name}-0\n"
            + _INIT_SETUP
            + f'hosts="{hosts}"\n'
            + _INIT_BROKER_OPEN
            + broker + "\n"
            + _INIT_COPY_VIEW)


# entrypoint.sh, run by the node container: puts the view on PATH, writes helper scripts,
# places the curve certificate, encodes the resources, then starts the lead broker with the
# wrapped command (or interactively) on the first pod and follower brokers elsewhere.
_ENTRY_ENVIRONMENT = """
fluxuser=$(whoami)
fluxuid=$(id -u $fluxuser)

# Ensure spack view is on the path, wherever it is mounted
viewbase="/mnt/flux"
viewroot=${viewbase}/view
configroot=${viewbase}/config
software="${viewbase}/software"
viewbin="${viewroot}/bin"
fluxpath=${viewbin}/flux

# Important to add AFTER in case software in container duplicated (e.g., Python)
export PATH=$PATH:${viewbin}

# Copy mount software to /opt/software
cp -R ${viewbase}/software/* /opt/software/

# Flux should use the Python with its install
foundroot=$(find $viewroot -maxdepth 2 -type d -path $viewroot/lib/python3*) > /dev/null 2>&1
pythonversion=$(basename ${foundroot})
pythonversion=${viewroot}/bin/${pythonversion}
echo "Python version: $pythonversion"
echo "Python root: $foundroot"

# If we found the right python, ensure it's linked (old link does not work)
if [[ -f "${pythonversion}" ]]; then
   rm -rf $viewroot/bin/python3
   rm -rf $viewroot/bin/python
   ln -s ${pythonversion} $viewroot/lib/python  || true
   ln -s ${pythonversion} $viewroot/lib/python3 || true
fi

# Ensure we have flux's python on the path
export PYTHONPATH=${PYTHONPATH:-""}:${foundroot}/site-packages
export FLUX_RC_EXTRA=$viewroot/etc/flux/rc1.d

# Write a script to load fluxion
cat <<EOT >> /tmp/load-fluxion.sh
flux module remove sched-simple
flux module load sched-fluxion-resource
flux module load sched-fluxion-qmanager
EOT
mv /tmp/load-fluxion.sh ${viewbase}/load-fluxion.sh

# Write an easy file we can source for the environment
cat <<EOT >> /tmp/flux-view.sh
#!/bin/bash
export PATH=$PATH
export PYTHONPATH=$PYTHONPATH
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-""}:$viewroot/lib
export fluxsocket=local://${configroot}/run/flux/local
EOT
mv /tmp/flux-view.sh ${viewbase}/flux-view.sh

# Variables we can use again
cfg="${configroot}/etc/flux/config"
command="$@"

# Copy mounted curve to expected location
curvepath=/mnt/flux/config/etc/curve/curve.cert
cp /curve/curve.cert ${curvepath}

# Remove group and other read
chmod o-r ${curvepath}
chmod g-r ${curvepath}
chown -R ${fluxuid} ${curvepath}

# Generate host resources
hosts=$(cat ${configroot}/etc/flux/system/hostlist)
"""

_ENTRY_STATE = """mv /tmp/R ${configroot}/etc/flux/system/R

# Put the state directory in /var/lib on shared view
export STATE_DIR=${configroot}/var/lib/flux
export FLUX_OUTPUT_DIR=/tmp/fluxout
mkdir -p ${STATE_DIR} ${FLUX_OUTPUT_DIR}

# Main host <name>-0 and the fully qualified domain name
"""

_ENTRY_LEAD = """workdir=$(pwd)

# Make cron.d directory
mkdir -p ${configroot}/etc/flux/system/cron.d
brokerOptions="-Scron.directory=${configroot}/etc/flux/system/cron.d \\
  -Stbon.fanout=256 \\
  -Srundir=${configroot}/run/flux  \\
  -Sstatedir=${STATE_DIR} -Slocal-uri=local://$configroot/run/flux/local \\
  -Slog-stderr-level=0  \\
  -Slog-stderr-mode=local"

# Run an interactive cluster, giving no command to flux start
run_interactive_cluster() {
    echo "\U0001f300 flux broker --config-path ${cfg} ${brokerOptions}"
    flux broker --config-path ${cfg} ${brokerOptions}
}

# Start flux with the original entrypoint
if [ "$(hostname)" = "${mainHost}" ]; then

  echo "Command provided is: ${command}"
  if [ -z "${command}" ]; then
    run_interactive_cluster
  else

    # If tasks are == 0, then only define nodes
"""

_ENTRY_FOLLOWERS = """    echo "Flags for flux are ${flags}"
    echo "\U0001f300 flux start  -o --config ${cfg} ${brokerOptions} flux submit ${flags} --quiet --watch ${command}"
\tflux start  -o --config ${cfg} ${brokerOptions} flux run ${flags} ${command}
  fi

# Block run by workers
else

    # We basically sleep/wait until the lead broker is ready
    echo "\U0001f300 flux start  -o --config ${configroot}/etc/flux/config ${brokerOptions}"

    # We can keep trying forever, don't care if worker is successful or not
    # Unless retry count is set, in which case we stop after retries
    while true
    do
        flux start -o --config ${configroot}/etc/flux/config ${brokerOptions}
        retval=$?
        if [[ "${retval}" -eq 0 ]] || [[ "false" == "true" ]]; then
             echo "The follower worker exited cleanly. Goodbye!"
             break
        fi
        echo "Return value for follower worker is ${retval}"
        echo "\U0001f62a Sleeping 15s to try again..."
        sleep 15
    done
fi

# Marker of completion, if needed
touch $viewbase/flux-operator-complete.txt
"""


def entrypoint_script(resource_spec: str, main_host: str, run_flags: str) -> str:
    """``resource_spec``: the ``flux R encode`` options after ``--hosts`` (cores, GPUs);
    ``main_host``: the lead broker's hostname; ``run_flags``: ``flux run``'s sizing."""
    return (_preamble()
            + _ENTRY_ENVIRONMENT
            + f"flux R encode --hosts=${{hosts}} {resource_spec} > /tmp/R\n"
            + _ENTRY_STATE
            + f'mainHost="{main_host}"\n'
            + _ENTRY_LEAD
            + f'    flags="{run_flags}  "\n'
            + _ENTRY_FOLLOWERS)
