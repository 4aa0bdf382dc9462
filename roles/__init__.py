"""llamarack's roles, one folder each (installed as ``llamarack.roles``).

Each ``roles/<role>/`` holds the role's one ``@deploy`` entry point (its
``__init__.py``), its plan (``plan.py``: pure functions of settings and
facts), its operations (``operations.py``) and its templates
(``templates/``). Another pyinfra deploy uses a role the way ``deploy.py``
does:

    from pyinfra import host
    from llamarack.roles.preflight import preflight
    from llamarack.roles.server import llama_server
    from llamarack.settings import settings_for

    settings = settings_for(host)
    facts = preflight(settings)
    if facts:
        llama_server(settings, facts)
"""
