"""llamarack's roles, one folder each (installed as ``llamarack.roles``).

Each ``roles/<role>/`` holds the role's one ``@deploy`` entry point
(``deploy.py``), its plan (``plan.py``: pure functions of settings and
facts), its operations (``operations.py``), its settings section
(``settings.py``: defaults, shapes, meanings) and its templates
(``templates/``); its ``__init__.py`` only describes it, so that importing
a plan (as ``llamarack audit`` does) imports no operation. Another pyinfra
deploy uses a role the way ``deploy.py`` does:

    from pyinfra import host
    from llamarack.roles.preflight.deploy import preflight
    from llamarack.roles.server.deploy import llama_server
    from llamarack.settings import settings_for

    settings = settings_for(host)
    facts = preflight(settings)
    if facts:
        llama_server(settings, facts)
"""
