"""Studies of the scheduling policies: the simulated sweep (``sweep.sh``), its tables and
figure (``tables``), and how much of a policy's gap to ``oracle`` prediction error explains
(``prediction_sensitivity``)."""
