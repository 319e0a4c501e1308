"""Where a job runs and the room it holds there, for both modes: the Placer (``placer``),
the one choice among workers (``chooser``) and its policies (``policy``), room per Node
(``capacity``), what a job asks (``need``), the one writer of reservations and quota holds
(``reservations``), and in Kueue mode a worker Kueue's quota (``worker_quota`` reads it,
``kueue_quota`` does its arithmetic)."""
