# SPDX-License-Identifier: Apache-2.0
# The library is built layer by layer (docs/architecture.md): each layer is
# an OBJECT library whose include path holds its own folders and those of
# the layers below it, never one above, so an upward #include fails to
# compile. Headers are included by base name ("engine.h"), which is why
# two headers of the library may not share one (tests/check_layers.py).
#
#   kvf_add_layer(<name> DIRS <folders under src/> SOURCES <files> BELOW <layers>)
#
# BELOW names every layer this one may use, directly or not.

# What every layer compiles with: the public header, the build's features
# and the include paths of third-party headers.
add_library(kvf_layer_settings INTERFACE)
target_include_directories(kvf_layer_settings INTERFACE ${PROJECT_SOURCE_DIR}/include
                           ${KVF_XXHASH_INCLUDE})
target_compile_definitions(kvf_layer_settings INTERFACE KVF_BUILDING_LIBRARY _GNU_SOURCE
  $<$<BOOL:${KVF_HAVE_CUDA}>:KVF_HAVE_CUDA> $<$<BOOL:${KVF_HAVE_URING}>:KVF_HAVE_URING>
  $<$<BOOL:${KVF_HAVE_HIREDIS}>:KVF_HAVE_HIREDIS> $<$<BOOL:${KVF_HAVE_REDIS_TLS}>:KVF_HAVE_REDIS_TLS>
  $<$<BOOL:${KVF_HAVE_YAML}>:KVF_HAVE_YAML> $<$<BOOL:${KVF_HAVE_S3}>:KVF_HAVE_S3>)
if(KVF_HAVE_URING)
  target_include_directories(kvf_layer_settings INTERFACE ${KVF_URING_INCLUDE})
endif()
if(KVF_HAVE_HIREDIS)
  target_include_directories(kvf_layer_settings INTERFACE ${HIREDIS_INCLUDE_DIRS})
endif()
if(KVF_HAVE_S3)
  target_include_directories(kvf_layer_settings INTERFACE ${CURL_INCLUDE_DIRS} ${EXPAT_INCLUDE_DIRS})
endif()
if(KVF_HAVE_YAML)
  target_include_directories(kvf_layer_settings INTERFACE ${YAML_INCLUDE_DIRS})
endif()
if(KVF_HAVE_CUDA)
  target_include_directories(kvf_layer_settings INTERFACE ${CUDAToolkit_INCLUDE_DIRS})
endif()

set(KVF_LAYERS "")
set(KVF_LAYER_ALL_DIRS "")

function(kvf_add_layer name)
  cmake_parse_arguments(PARSE_ARGV 1 L "" "" "DIRS;SOURCES;BELOW")
  set(own "")
  foreach(d IN LISTS L_DIRS)
    list(APPEND own ${PROJECT_SOURCE_DIR}/src/${d})
  endforeach()
  set(below "")
  foreach(b IN LISTS L_BELOW)
    if(NOT TARGET kvf_${b})
      message(FATAL_ERROR "layer ${name}: layer ${b} below it is not defined yet")
    endif()
    get_property(dirs TARGET kvf_${b} PROPERTY KVF_LAYER_DIRS)
    list(APPEND below ${dirs})
  endforeach()
  add_library(kvf_${name} OBJECT ${L_SOURCES})
  set_property(TARGET kvf_${name} PROPERTY KVF_LAYER_DIRS ${own})
  target_include_directories(kvf_${name} PRIVATE ${own} ${below})
  target_link_libraries(kvf_${name} PRIVATE kvf_layer_settings)
  set(KVF_LAYERS ${KVF_LAYERS} kvf_${name} PARENT_SCOPE)
  set(KVF_LAYER_ALL_DIRS ${KVF_LAYER_ALL_DIRS} ${own} PARENT_SCOPE)
endfunction()
