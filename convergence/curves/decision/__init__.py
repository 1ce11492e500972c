"""From a comparison's statistics to a decision, and what a decision costs: the declared tests on one endpoint and
their exact power (``equivalence``), the rule a result was judged by and its verdict (``verdict``), and the runs and
GPU-hours a test needs per design (``designs``)."""
