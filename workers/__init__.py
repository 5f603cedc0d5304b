from workers.startup import begin_imports

begin_imports()  # the imports that follow collect rarely: workers/startup.py
