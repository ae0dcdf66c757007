"""The run: launching it (launch, programs), one rank's rounds (trainer, rounds, statistics) and the tests' record of
them (debug)."""
