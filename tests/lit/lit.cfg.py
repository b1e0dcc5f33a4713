# lit configuration for ganc's IR and driver tests.
import os
import lit.formats

config.name = "ganc"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".ganc", ".test"]
config.excludes = ["lit.cfg.py", "lit.site.cfg.py", "Inputs"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.ganc_build_dir, "tests", "lit")
config.environment["FILECHECK_OPTS"] = "-enable-var-scope --allow-unused-prefixes=false"
config.environment["PYTHONPATH"] = os.path.join(config.ganc_source_dir, "python")
config.substitutions.append(("%ganc-opt", os.path.join(config.ganc_build_dir, "tools", "ganc-opt")))
config.substitutions.append(("%ganc", os.path.join(config.ganc_build_dir, "tools", "ganc")))
config.substitutions.append(("%python", config.python))
config.substitutions.append(("%models", config.ganc_models_dir))
config.substitutions.append(("%srcroot", config.ganc_source_dir))
config.substitutions.append(("FileCheck", config.filecheck))
config.substitutions.append(("not ", os.path.join(os.path.dirname(os.path.realpath(config.filecheck)), "not") + " "))
if config.ganc_with_torch:
    config.available_features.add("torch")
