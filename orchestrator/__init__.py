from workers.startup import begin_imports, imports_done

begin_imports()  # the imports that follow collect rarely: workers/startup.py

__all__ = ["imports_done"]
