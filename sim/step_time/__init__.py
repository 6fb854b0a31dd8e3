"""Step time: the models a replica asks for its iterations, their fitting (calibration) and the loop's host time."""
