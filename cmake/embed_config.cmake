# Writes INPUT (a YAML file) into OUTPUT as a C++ string constant.
file(READ ${INPUT} content)
file(WRITE ${OUTPUT}
  "// Generated from configs/tiny.yaml by cmake/embed_config.cmake; do not edit.\n"
  "namespace dspine::core {\n"
  "extern const char* const kEmbeddedDefaultConfig;\n"
  "const char* const kEmbeddedDefaultConfig = R\"dspine_yaml(${content})dspine_yaml\";\n"
  "}  // namespace dspine::core\n")
