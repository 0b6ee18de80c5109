from retrysim.cli.main import run_process

run_process()
