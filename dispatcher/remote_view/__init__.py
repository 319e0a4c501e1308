"""The remote view: a read-only aggregated API (``remote.trainjob-dispatcher.io/v1alpha1``)
through which a manager user sees a job's life on its worker, the Pods, Events and logs of
the job's copy, as the manager's RBAC allows that user, never with a worker's credentials.

The manager's apiserver proxies each request to the dispatcher (an APIService), with the
user in X-Remote-* headers over TLS with its front-proxy client certificate
(``authn``); each request is authorized for that user with a SubjectAccessReview
(``authz``); the copy and its worker are found from the dispatcher's caches (``copies``)
and the worker is read with clients of this package's own (``worker_reads``), so nothing
here waits on, or takes from, placement and the reconciles. ``server`` serves it,
``discovery`` the documents kubectl discovers it by, ``items`` what a Pod and an Event
look like here, ``logs`` the log options, ``certificate`` the serving certificate.
"""

GROUP = "remote.trainjob-dispatcher.io"
VERSION = "v1alpha1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
# The labels every item carries: the TrainJob it is of, and the worker it was read from.
TRAINJOB_LABEL = f"{GROUP}/trainjob"
WORKER_LABEL = f"{GROUP}/worker"
PODS = "trainjobpods"
EVENTS = "trainjobevents"
LOG = "log"
# The APIService and the Service in front of the dispatcher, as manifests/remote-api
# names them.
APISERVICE = f"{VERSION}.{GROUP}"
SERVICE = "trainjob-dispatcher-remote-api"
